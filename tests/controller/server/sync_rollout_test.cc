// Rolling waves on the controller (docs/staging-rollout.md, "Rolling waves";
// sync_rollout.cc): a decided staged sync's CommitSync goes out replica by
// replica under rollout.max_unavailable, survives a lost replica and a
// controller restart mid-rollout, and the controller reports (and bounds,
// with max_staleness) what each replica serves. Workers are simulated by
// calls; one source rank feeds four replicated destination ranks.
#include <errno.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shadow_extents.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/rollout_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

TEST_F(SyncRolloutTest, WavesGoOutInRankOrderNeverMoreThanMaxUnavailableAtOnce) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/2).ok());
  RunToDecision(1);
  v1::SyncStatus st = Status();
  ASSERT_TRUE(st.has_rollout());
  EXPECT_EQ(st.rollout().waves_total(), 2);
  EXPECT_EQ(st.rollout().waves_done(), 0);
  EXPECT_EQ(st.rollout().committing(), 2);
  ASSERT_EQ(st.rollout().replicas_size(), kReplicas);
  EXPECT_EQ(st.rollout().replicas(0).replica(), "ranks-0-0");
  EXPECT_EQ(st.rollout().replicas(2).state(), "waiting");
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0, 1));
  Report(dst_[0], false, /*committed=*/true);
  EXPECT_TRUE(Committing().empty()) << "the next wave waits for the whole wave";
  Report(dst_[1], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(2, 3));
  st = Status();
  EXPECT_EQ(st.rollout().waves_done(), 1);
  EXPECT_EQ(st.rollout().replicas(0).state(), "committed");
  EXPECT_EQ(st.rollout().replicas(0).version(), 1);
  EXPECT_EQ(st.rollout().replicas(2).state(), "committing");
  EXPECT_EQ(st.rollout().replicas(2).wave(), 1);
  // Status while waves run: replicas 0, 1 serve 1 as the controller knows.
  const v1::TransferStatus ts = controller_->syncs().GetStatus().transfers(0);
  EXPECT_EQ(ts.rollout().max_unavailable(), 2);
  ASSERT_EQ(ts.replicas_size(), 2);
  EXPECT_EQ(ts.replicas(0).version(), 1);
  EXPECT_EQ(CommittedMetric("ranks-1-1"), 1);
  EXPECT_EQ(CommittedMetric("ranks-2-2"), -1) << "not committed yet";
  Report(dst_[2], false, true);
  Report(dst_[3], false, true);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_EQ(st.rollout().waves_done(), 2);
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).replicas_size(), kReplicas);
}

TEST_F(SyncRolloutTest, ZeroMaxUnavailableCommitsEveryReplicaAtOnce) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/0).ok());
  RunToDecision(1);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(Status().rollout().waves_total(), 1);
}

TEST_F(SyncRolloutTest, OwnersLabelsGroupRanksIntoReplicasThatCommitTogether) {
  RegisterAll();
  // Ranks 0 and 3 form replica "a", 1 and 2 replica "b" (their owners say).
  const char* labels[kReplicas] = {"a", "b", "b", "a"};
  for (int r = 0; r < kReplicas; ++r) {
    google::protobuf::RepeatedPtrField<v1::ServingReport> reports;
    v1::ServingReport* rep = reports.Add();
    rep->set_group("dst");
    rep->set_state(v1::SERVING_STATE_SERVING);
    rep->set_replica(labels[r]);
    rep->set_replica_ranks(2);
    ASSERT_TRUE(controller_->RecordServing(dst_[r], reports).ok());
  }
  ASSERT_TRUE(Define(/*max_unavailable=*/1, /*replica_ranks=*/0).ok());
  RunToDecision(1);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0, 3)) << "replica a: both ranks at once";
  Report(dst_[0], false, true);
  Report(dst_[3], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(1, 2));
  const v1::SyncStatus st = Status();
  ASSERT_EQ(st.rollout().replicas_size(), 2);
  EXPECT_EQ(st.rollout().replicas(0).replica(), "a");
  EXPECT_THAT(st.rollout().replicas(0).ranks(), ::testing::ElementsAre(0, 3));
}

TEST_F(SyncRolloutTest, AReceiverLostMidWaveHoldsItsWaveForOneLeaseTtlThenTheRolloutGoesOn) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1);
  // Heartbeats every live lease and ticks for one lease TTL.
  auto one_ttl = [&](const std::vector<std::string>& alive) {
    const absl::Time until = absl::Now() + config_.lease_ttl + absl::Milliseconds(60);
    while (absl::Now() < until) {
      for (const std::string& l : alive) (void)controller_->workers().Heartbeat(l);
      controller_->Tick();
      absl::SleepFor(absl::Milliseconds(10));
    }
  };
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0));
  controller_->workers().CloseStream(dst_[0], tokens_[dst_[0]], "killed mid-commit");
  EXPECT_TRUE(Committing().empty())
      << "it may be committing still: it holds the next wave for one lease TTL";
  one_ttl({src_, dst_[1], dst_[2], dst_[3]});
  EXPECT_THAT(Committing(), ::testing::ElementsAre(1)) << "then the rollout goes on";
  // Lost before its wave: it stays waiting; its wave goes out when due (it
  // hears it if it registers again), and holds the next one for a TTL.
  controller_->workers().CloseStream(dst_[2], tokens_[dst_[2]], "killed while waiting");
  Report(dst_[1], false, true);
  one_ttl({src_, dst_[1], dst_[3]});
  EXPECT_THAT(Committing(), ::testing::ElementsAre(3));
  Report(dst_[3], false, true);
  const v1::SyncStatus st = Status();
  // dst/0 and dst/2 may still register again and commit (until the deadline
  // plus their --decision_slack): the sync waits for them.
  EXPECT_EQ(st.phase(), v1::SYNC_RUNNING) << st.error();
  EXPECT_EQ(st.uncommitted_size(), 0);
  EXPECT_EQ(st.rollout().replicas(1).state(), "committed");
  EXPECT_EQ(st.rollout().replicas(3).state(), "committed");
}

TEST_F(SyncRolloutTest, ARestartedControllerResumesTheRemainingWavesOnly) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0));
  Report(dst_[0], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(1));  // wave 1 saved, then sent

  Restart();  // killed while wave 1 commits
  const std::vector<v1::RegisterWorkerResponse> regs = RegisterAll();
  // dst/0 (done before the save of wave 1) hears nothing; dst/1 commits
  // (its wave started); dst/2, dst/3 keep their shadows and wait.
  EXPECT_EQ(regs[0].decided_commits_size(), 0);
  ASSERT_EQ(regs[1].decided_commits_size(), 1);
  EXPECT_FALSE(regs[1].decided_commits(0).await_commit());
  for (int r : {2, 3}) {
    ASSERT_EQ(regs[r].decided_commits_size(), 1) << r;
    EXPECT_TRUE(regs[r].decided_commits(0).await_commit()) << r;
  }
  EXPECT_TRUE(Committing().empty()) << "no wave beside the one committing";
  Report(dst_[1], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(2));
  Report(dst_[2], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(3));
  Report(dst_[3], false, true);
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
  EXPECT_EQ(st.rollout().waves_done(), 4);
}

// Session 16 (docs/staging.md, "Known gaps ... resolved in session 16"):
// served versions are saved with the decided commits.
TEST_F(SyncRolloutTest, ServedVersionsSurviveARestartMidRolloutAndTheRolloutGoesOn) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1);
  FinishRollout();
  ASSERT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  RunToDecision(2);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0));
  Report(dst_[0], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(1));  // wave 1 saved, then sent
  auto serving = [&]() {
    std::map<std::string, int64_t> out;  // "<instance>/<rank>" -> version
    const v1::ListWorkersResponse listed = controller_->ListWorkers("dst");
    for (const v1::RegisteredWorker& w : listed.workers()) {
      for (const v1::RankVersion& v : w.serving_versions()) {
        out[absl::StrCat(w.instance_id(), "/", v.rank())] = v.version();
      }
    }
    return out;
  };
  auto replicas = [&]() {
    std::string out;
    const v1::GetStatusResponse status = controller_->syncs().GetStatus();
    for (const v1::ReplicaVersion& r : status.transfers(0).replicas()) {
      out += r.ShortDebugString() + "\n";
    }
    return out;
  };
  const std::string replicas_before = replicas();
  EXPECT_THAT(replicas_before, HasSubstr("version: 2"));
  const std::map<std::string, int64_t> serving_before = serving();
  EXPECT_EQ(serving_before.at("d0/0"), 2);
  EXPECT_EQ(serving_before.at("d3/3"), 1);
  EXPECT_EQ(CommittedMetric("ranks-0-0"), 2);

  Restart();  // killed while wave 1 commits
  RegisterAll();
  EXPECT_EQ(replicas(), replicas_before);
  EXPECT_EQ(serving(), serving_before);
  // The rollout goes on by the documented rule: the wave that was
  // committing, then the rest, one at a time.
  Report(dst_[1], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(2));
  Report(dst_[2], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(3));
  Report(dst_[3], false, true);
  EXPECT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  const v1::GetStatusResponse after = controller_->syncs().GetStatus();
  for (const v1::ReplicaVersion& r : after.transfers(0).replicas()) {
    EXPECT_EQ(r.version(), 2) << r.replica();
    EXPECT_EQ(r.state(), "serving") << r.replica();
  }
  // Saved with the outcome too: a later restart still knows them.
  Restart();
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).replicas_size(), kReplicas);
}

TEST_F(SyncRolloutTest, AReplicaHeldByItsOwnerHoldsNoWaveBackAndCommitsOnceAdmitted) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0));
  HeldReport(dst_[0], /*held=*/true);
  // Held: not committing (it serves the old version), so wave 1 goes out.
  EXPECT_THAT(Committing(), ::testing::ElementsAre(1));
  v1::SyncStatus st = Status();
  EXPECT_EQ(st.rollout().replicas(0).state(), "held");
  EXPECT_EQ(st.rollout().committing(), 1);
  HeldReport(dst_[0], /*held=*/false);  // admitted: waits for a wave with room
  EXPECT_TRUE(Committing().empty()) << "max_unavailable = 1: dst/1 still commits";
  Report(dst_[1], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0)) << "the admitted replica comes first";
  Report(dst_[0], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(2));
  Report(dst_[2], false, true);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(3));
  Report(dst_[3], false, true);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
}

// Review of the session-16 merge: the held state was saved only with a later
// wave, so a restart right after the last replica's hold brought it back as
// committing, and its admission was ignored.
TEST_F(SyncRolloutTest, AHeldReplicaIsStillHeldAfterARestartAndCommitsOnceAdmitted) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/0).ok());
  RunToDecision(1);
  for (int r : {1, 2, 3}) Report(dst_[r], false, true);
  HeldReport(dst_[0], /*held=*/true);  // the last change before the restart
  Restart();
  RegisterAll();
  v1::SyncStatus st = Status();
  ASSERT_EQ(st.rollout().replicas_size(), kReplicas);
  EXPECT_EQ(st.rollout().replicas(0).state(), "held");
  EXPECT_TRUE(Committing().empty()) << "a held replica is not committing";
  HeldReport(dst_[0], /*held=*/false);  // admitted: its wave goes out
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0));
  Report(dst_[0], false, true);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
}

TEST_F(SyncRolloutTest, AReplicaStillHeldAtTheDeadlineIsListedUncommittedTheOthersCommit) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1, false, /*deadline_ms=*/800);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0));
  HeldReport(dst_[0], /*held=*/true);
  FinishRollout();  // dst/1, dst/2, dst/3 one wave each, before the deadline
  std::vector<std::string> alive = dst_;
  alive.push_back(src_);
  const v1::SyncStatus st = TickUntilEnded(sync_id_, alive, absl::Seconds(10));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("owner held syncs off"));
  for (int r = 1; r < kReplicas; ++r) EXPECT_EQ(st.rollout().replicas(r).state(), "committed");
  auto a = controller_->workers().NextAssignment(dst_[0], tokens_[dst_[0]], absl::Seconds(1));
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_TRUE((**a).has_abort()) << "dst/0 rolls back";
}

TEST_F(SyncRolloutTest, ADecisionSavedBeforeRollingWavesResumesForEveryReceiver) {
  // A state file of the previous version: no wave fields; each receiver had
  // been sent its CommitSync at the decision.
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1);
  auto saved = store_->Load();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->decided_syncs_size(), 1);
  v1::DecidedSync* d = saved->mutable_decided_syncs(0);
  d->clear_rollout();
  d->clear_waves_started();
  for (v1::DecidedParticipant& p : *d->mutable_participants()) {
    p.clear_commit_sent();
    p.clear_replica();
    p.clear_wave();
  }
  ASSERT_TRUE(store_->Save(*saved).ok());
  Restart();
  const std::vector<v1::RegisterWorkerResponse> regs = RegisterAll();
  for (int r = 0; r < kReplicas; ++r) {
    ASSERT_EQ(regs[r].decided_commits_size(), 1) << r;
    EXPECT_FALSE(regs[r].decided_commits(0).await_commit()) << r;
  }
  for (const std::string& l : dst_) Report(l, false, true);
  EXPECT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
}

TEST_F(SyncRolloutTest, AWaveNotStartedByTheDeadlineIsToldToRollBack) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/3).ok());
  RunToDecision(1, false, /*deadline_ms=*/300);
  EXPECT_THAT(Committing(), ::testing::ElementsAre(0, 1, 2));
  Report(dst_[0], false, true);
  Report(dst_[1], false, true);
  // dst/2 stays silent: the deadline passes before dst/3's wave.
  std::vector<std::string> alive = dst_;
  alive.push_back(src_);
  const v1::SyncStatus st = TickUntilEnded(sync_id_, alive, absl::Seconds(10));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 2);
  EXPECT_THAT(st.uncommitted(1), HasSubstr("wave had not started"));
  auto a = controller_->workers().NextAssignment(dst_[3], tokens_[dst_[3]], absl::Seconds(1));
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_TRUE((**a).has_abort()) << "dst/3 rolls back at once";
}

TEST_F(SyncRolloutTest, MaxStalenessRefusesANewVersionUntilALaggingReplicaIsBroughtUp) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/2, 1, /*max_staleness=*/1).ok());
  RunToDecision(1);
  FinishRollout();
  ASSERT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  RunToDecision(2);
  FinishRollout(/*failing=*/1);
  ASSERT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  // dst/1 confirmed version 1 last: version 3 would put it 2 behind.
  auto refused = Sync(3);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("replica 'ranks-1-1' (ranks 1) serves version 1"));
  EXPECT_THAT(refused.status().message(), HasSubstr("max_staleness = 1"));
  EXPECT_THAT(refused.status().message(), HasSubstr("resend version 2"));
  // ListWorkers: dst/1's worker shows version 0 (uncommitted), the others 2.
  const v1::ListWorkersResponse listed = controller_->ListWorkers("dst");
  for (const v1::RegisteredWorker& w : listed.workers()) {
    ASSERT_EQ(w.serving_versions_size(), 1) << w.instance_id();
    EXPECT_EQ(w.serving_versions(0).version(), w.instance_id() == "d1" ? 0 : 2) << w.instance_id();
  }
  RunToDecision(2, /*resend=*/true);
  FinishRollout();
  ASSERT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  EXPECT_TRUE(Sync(3).ok()) << "every replica serves 2 now";
}

TEST_F(SyncRolloutTest, APolicyIsValidatedAtDefinition) {
  RegisterAll();
  auto in_place = Define(1, 1, 0, v1::STAGING_IN_PLACE);
  ASSERT_FALSE(in_place.ok());
  EXPECT_EQ(in_place.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(in_place.status().message(), HasSubstr("needs a staged transfer"));
  auto negative = Define(-1);
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("rollout.max_unavailable = -1"));
  EXPECT_TRUE(Define(0, 1, 2, v1::STAGING_IN_PLACE).ok()) << "a staleness bound needs no waves";
}

}  // namespace
}  // namespace wsync::controller
