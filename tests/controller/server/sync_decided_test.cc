// A staged sync's commit decision survives a controller restart
// (docs/staging.md, "The commit rule"; sync_decided.cc): saved before the
// first CommitSync, restored running, resumed for the receivers that register
// again; one that never comes back is listed uncommitted at the deadline.
// Workers are simulated by calls; the controller restarts on the same file.
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/shadow_extents.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

class SyncDecidedTest : public controller_testing::CoordinatorFixture {
 protected:
  SyncDecidedTest() {
    std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-decided-XXXXXX");
    EXPECT_NE(mkdtemp(dir.data()), nullptr);
    store_ = std::make_unique<StateStore>(dir + "/controller.state");
    Restart();
  }

  // src/0, src/1 -> dst/0 (SimpleTransfer), registered through the
  // Controller (as the service does): returns dst/0's registration.
  v1::RegisterWorkerResponse RegisterAll() {
    s0_ = Join("a", "src", 0, 2, 16).lease_id();
    s1_ = Join("b", "src", 1, 2, 16).lease_id();
    v1::RegisterWorkerResponse d = Join("c", "dst", 0, 1, 32);
    d0_ = d.lease_id();
    for (const auto& l : {s0_, s1_, d0_}) tokens_[l] = *controller_->workers().OpenStream(l);
    return d;
  }

  // A staged receiver or sender (decision_slack_ms < 0: unset, as an older
  // worker).
  v1::RegisterWorkerResponse Join(const std::string& instance, const std::string& group, int rank,
                                  int size, int64_t bytes, int64_t decision_slack_ms = -1) {
    controller_testing::Joining j;
    j.capabilities = {kStagedSyncsCapability};  // staged transfers need it
    if (decision_slack_ms >= 0) j.decision_slack_ms = decision_slack_ms;
    return CoordinatorFixture::Join(instance, group, rank, size, bytes, j);
  }

  void DefineStaged() {
    v1::DefineTransferRequest req = controller_testing::SimpleTransfer();
    req.mutable_spec()->mutable_staging()->set_mode(v1::STAGING_HOST_SHADOW);
    auto resp = controller_->syncs().DefineTransfer(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
  }

  // Starts `version` (deadline `deadline_ms`), the senders report success
  // and dst/0 staged: the commit is decided.
  void RunToDecision(int64_t version, int64_t deadline_ms) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(version);
    req.set_deadline_ms(deadline_ms);
    auto started = controller_->syncs().StartSync(req);
    ASSERT_TRUE(started.ok()) << started.status();
    sync_id_ = started->sync_id();
    for (const auto& l : {s0_, s1_, d0_}) Next(l, tokens_[l]);
    Report(s0_, false, false);
    Report(s1_, false, false);
    Report(d0_, /*staged=*/true, false);
  }

  void Report(const std::string& lease, bool staged, bool committed, int32_t code = 0) {
    ReportStaged(lease, sync_id_, staged, committed, code,
                 code != 0 ? "holds no staged shadow of version 1" : "");
  }

  v1::SyncStatus Status() {
    auto st = controller_->syncs().WaitSync(sync_id_, absl::Milliseconds(1));
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::SyncStatus();
  }

  std::string s0_, s1_, d0_, sync_id_;
  std::map<std::string, uint64_t> tokens_;
};

TEST_F(SyncDecidedTest, TheDecisionIsSavedBeforeTheFirstCommitSync) {
  RegisterAll();
  DefineStaged();
  RunToDecision(1, 30000);
  ASSERT_TRUE(Status().commit_decided());
  auto saved = store_->Load();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->decided_syncs_size(), 1);
  const v1::DecidedSync& d = saved->decided_syncs(0);
  EXPECT_EQ(d.status().sync_id(), sync_id_);
  EXPECT_TRUE(d.status().commit_decided());
  EXPECT_EQ(d.staging().mode(), v1::STAGING_HOST_SHADOW);
  ASSERT_EQ(d.participants_size(), 3);
  int receivers = 0;
  for (const v1::DecidedParticipant& p : d.participants()) {
    if (!p.receiver()) continue;
    ++receivers;
    EXPECT_FALSE(p.done());
    ASSERT_EQ(p.roles_size(), 1);
    EXPECT_EQ(p.roles(0).group(), "dst");
  }
  EXPECT_EQ(receivers, 1);
  // Once confirmed, the outcome replaces it.
  Report(d0_, false, /*committed=*/true);
  EXPECT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  saved = store_->Load();
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->decided_syncs_size(), 0);
  EXPECT_EQ(saved->transfers(0).last_success_version(), 1);
}

TEST_F(SyncDecidedTest, ADecisionThatCannotBeSavedIsNeverSentAndEveryReceiverRollsBack) {
  // Review finding: the commit went out although its save failed, so a
  // restart could not resume it (receivers split between V and V-1).
  RegisterAll();
  DefineStaged();
  store_->SetDataSyncForTesting([](int) {
    errno = EIO;
    return -1;
  });
  RunToDecision(1, 30000);
  const v1::SyncStatus s = Status();
  EXPECT_EQ(s.phase(), v1::SYNC_FAILED);
  EXPECT_FALSE(s.commit_decided());
  EXPECT_THAT(s.error(), HasSubstr("the commit decision could not be saved"));
  // dst/0 is told to roll back, never to commit.
  auto a = controller_->workers().NextAssignment(d0_, tokens_[d0_], absl::Seconds(1));
  ASSERT_TRUE(a.ok() && a->has_value()) << a.status();
  EXPECT_TRUE((**a).has_abort());
  EXPECT_FALSE((**a).has_commit());
  store_->SetDataSyncForTesting(&fdatasync);
}

TEST_F(SyncDecidedTest, ARestartedControllerResumesTheCommitForAReceiverThatRegistersAgain) {
  RegisterAll();
  DefineStaged();
  RunToDecision(1, 30000);

  Restart();  // killed after the decision: no confirmation arrived
  auto running = controller_->syncs().WaitSync(sync_id_, absl::Milliseconds(1));
  ASSERT_TRUE(running.ok()) << "a decided sync is known after the restart: " << running.status();
  EXPECT_EQ(running->phase(), v1::SYNC_RUNNING);
  EXPECT_TRUE(running->commit_decided());
  v1::SyncRequest next;
  next.set_transfer("t");
  next.set_version(2);
  EXPECT_FALSE(controller_->syncs().StartSync(next).ok()) << "its transfer is busy until it ends";

  const v1::RegisterWorkerResponse dst = RegisterAll();
  ASSERT_EQ(dst.decided_commits_size(), 1) << "the receiver hears the decision at registration";
  EXPECT_EQ(dst.decided_commits(0).sync_id(), sync_id_);
  EXPECT_EQ(dst.decided_commits(0).version(), 1);
  EXPECT_EQ(Join("c2", "other", 0, 1, 16).decided_commits_size(), 0) << "another rank: nothing";
  Report(d0_, false, /*committed=*/true);  // on its new lease
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).last_success_version(), 1);

  Restart();  // the outcome is kept, nothing decided is left
  auto kept = controller_->syncs().WaitSync(sync_id_, absl::Milliseconds(1));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->phase(), v1::SYNC_SUCCEEDED);
  EXPECT_EQ(RegisterAll().decided_commits_size(), 0);
}

TEST_F(SyncDecidedTest, AReceiverWithoutItsShadowOrThatNeverComesBackIsListedUncommitted) {
  RegisterAll();
  DefineStaged();
  RunToDecision(1, 30000);
  Restart();
  RegisterAll();
  Report(d0_, false, false, static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << "decided: the others' commit stands";
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("dst/0"));
  EXPECT_THAT(st.uncommitted(0), HasSubstr("holds no staged shadow"));

  // Version 2 decided, then restarted; dst/0 (a slack of 1 s, saved with
  // the decision) never registers again: uncommitted once it stopped
  // waiting for the decision itself.
  controller_->workers().CloseStream(d0_, tokens_[d0_], "restarted with --decision_slack=1s");
  d0_ = Join("c", "dst", 0, 1, 32, /*decision_slack_ms=*/1000).lease_id();
  tokens_[d0_] = *controller_->workers().OpenStream(d0_);
  RunToDecision(2, 300);
  Restart();
  const std::string only_sender = Join("a", "src", 0, 2, 16).lease_id();
  st = TickUntilEnded(sync_id_, {only_sender}, absl::Seconds(10));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("not registered again since the controller restarted"));
  EXPECT_THAT(st.uncommitted(0), HasSubstr("--decision_slack of 1s"));
}

TEST_F(SyncDecidedTest, AReceiverLostAfterTheDecisionHearsItWhenItRegistersAgainBeforeItsDeadline) {
  // Review finding (session 14): a receiver whose lease ended after the
  // decision, the controller staying up, was listed uncommitted at once and
  // not told the decision when it registered again: it rolled back, serving
  // V-1 beside replicas on V.
  RegisterAll();
  DefineStaged();
  RunToDecision(1, 30000);
  controller_->workers().CloseStream(d0_, tokens_[d0_], "stream dropped");
  v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_RUNNING) << st.error();
  EXPECT_TRUE(st.uncommitted().empty()) << st.uncommitted(0);
  const v1::RegisterWorkerResponse again = Join("c", "dst", 0, 1, 32);
  ASSERT_EQ(again.decided_commits_size(), 1) << "it hears the decision";
  EXPECT_EQ(again.decided_commits(0).sync_id(), sync_id_);
  d0_ = again.lease_id();
  Report(d0_, false, /*committed=*/true);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
}

TEST_F(SyncDecidedTest, ALostReceiverIsListedUncommittedOnlyAfterItsDecisionSlack) {
  s0_ = Join("a", "src", 0, 2, 16).lease_id();
  s1_ = Join("b", "src", 1, 2, 16).lease_id();
  d0_ = Join("c", "dst", 0, 1, 32, /*decision_slack_ms=*/2500).lease_id();
  for (const auto& l : {s0_, s1_, d0_}) tokens_[l] = *controller_->workers().OpenStream(l);
  DefineStaged();
  RunToDecision(1, 300);
  controller_->workers().CloseStream(d0_, tokens_[d0_], "stream dropped");
  // Past the deadline and the failure grace (1 s), within its slack: the
  // receiver still waits for the decision, so the sync waits for it.
  v1::SyncStatus st = TickUntilEnded(sync_id_, {s0_, s1_}, absl::Milliseconds(1800));
  EXPECT_EQ(st.phase(), v1::SYNC_RUNNING) << st.error();
  st = TickUntilEnded(sync_id_, {s0_, s1_}, absl::Seconds(5));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("stream dropped"));
  EXPECT_THAT(st.uncommitted(0), HasSubstr("--decision_slack of 2.5s"));
}

TEST_F(SyncDecidedTest, ADecisionSlackOfZeroMeansZero) {
  s0_ = Join("a", "src", 0, 2, 16).lease_id();
  s1_ = Join("b", "src", 1, 2, 16).lease_id();
  d0_ = Join("c", "dst", 0, 1, 32, /*decision_slack_ms=*/0).lease_id();
  for (const auto& l : {s0_, s1_, d0_}) tokens_[l] = *controller_->workers().OpenStream(l);
  DefineStaged();
  RunToDecision(1, 300);
  // Saved as set (0, not absent): a restarted controller keeps it too.
  auto saved = store_->Load();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->decided_syncs_size(), 1);
  for (const v1::DecidedParticipant& p : saved->decided_syncs(0).participants()) {
    if (!p.receiver()) continue;
    EXPECT_TRUE(p.has_decision_slack_ms());
    EXPECT_EQ(p.decision_slack_ms(), 0);
  }
  const absl::Time start = absl::Now();
  controller_->workers().CloseStream(d0_, tokens_[d0_], "stream dropped");
  // The worker stops waiting at the deadline: so does the controller (not
  // 5 s later, the default of workers that send no slack).
  const v1::SyncStatus st = TickUntilEnded(sync_id_, {s0_, s1_}, absl::Seconds(4));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("--decision_slack of 0"));
}

TEST_F(SyncDecidedTest, AWorkerThatSendsNoDecisionSlackGetsTheDefault) {
  RegisterAll();  // no decision_slack_ms: a worker older than session 16
  DefineStaged();
  RunToDecision(1, 300);
  auto saved = store_->Load();
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (const v1::DecidedParticipant& p : saved->decided_syncs(0).participants()) {
    if (p.receiver()) {
      EXPECT_EQ(p.decision_slack_ms(), 5000);
    }
  }
}

TEST_F(SyncDecidedTest, AStateFileWithoutDecidedSyncsLoads) {
  // An older controller's file: transfers and outcomes only.
  v1::ControllerState old;
  v1::TransferState* t = old.add_transfers();
  t->set_name("t");
  *t->mutable_spec() = controller_testing::SimpleTransfer().spec();
  t->set_last_success_version(7);
  old.set_next_sync_id(9);
  ASSERT_TRUE(store_->Save(old).ok());
  Restart();
  RegisterAll();
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).last_success_version(), 7);
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).in_flight_version(), 0);
}

}  // namespace
}  // namespace wsync::controller
