// Staged syncs on the controller (docs/staging.md): the two phases, the
// checksum comparison, the commit rule for a receiver lost before and after
// the decision, and the shadow budget, with workers simulated by calls.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/shadow_extents.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SyncStagedTest : public controller_testing::CoordinatorFixture {
 protected:
  // src/0, src/1 -> dst/0 (SimpleTransfer, 8 fp32: 32 destination bytes),
  // staged in a host shadow with checksums.
  void SetUpStaged(int64_t dst_budget = 0) {
    s0_ = Register("a", "src", 0, 2, 16);
    s1_ = Register("b", "src", 1, 2, 16);
    d0_ = RegisterWithBudget("c", dst_budget);
    for (const auto& l : {s0_, s1_, d0_}) tokens_[l] = *controller_->workers().OpenStream(l);
  }

  std::string RegisterWithBudget(const std::string& instance, int64_t budget) {
    controller_testing::Joining j;
    j.staging_budget_bytes = budget;
    if (staged_capability_) j.capabilities = {kStagedSyncsCapability};
    return Join(instance, "dst", 0, 1, 32, j).lease_id();
  }

  absl::StatusOr<v1::DefineTransferResponse> DefineStaged(bool checksums = true,
                                                          bool verify = false) {
    v1::DefineTransferRequest req = controller_testing::SimpleTransfer();
    req.mutable_spec()->mutable_staging()->set_mode(v1::STAGING_HOST_SHADOW);
    req.mutable_spec()->mutable_staging()->set_checksums(checksums);
    req.mutable_spec()->mutable_staging()->set_verify(verify);
    return controller_->syncs().DefineTransfer(req);
  }

  // Every worker's assignment of a fresh sync of `version`.
  std::map<std::string, v1::SyncAssignment> Start(int64_t version) {
    auto started = StartSync(version);
    EXPECT_TRUE(started.ok()) << started.status();
    sync_id_ = started.ok() ? started->sync_id() : "";
    std::map<std::string, v1::SyncAssignment> out;
    for (const auto& l : {s0_, s1_, d0_}) out[l] = Next(l, tokens_[l]);
    return out;
  }

  // A report of `lease` with one checksum per bucket the plan moves.
  void Report(const std::string& lease, bool staged, bool committed,
              const std::map<int64_t, uint64_t>& hashes, bool sent) {
    ReportChecksums(lease, staged, {hashes.begin(), hashes.end()}, sent, committed);
  }

  // The next assignment of `lease` if one comes within 50 ms.
  std::optional<v1::Assignment> Pending(const std::string& lease) {
    auto a = controller_->workers().NextAssignment(lease, tokens_[lease], absl::Milliseconds(50));
    if (!a.ok() || !a->has_value()) return std::nullopt;
    return **a;
  }

  v1::SyncStatus Status() {
    auto st = controller_->syncs().WaitSync(sync_id_, absl::Milliseconds(1));
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::SyncStatus();
  }

  // A report of `lease` with these checksums, duplicates kept.
  void ReportChecksums(const std::string& lease, bool staged,
                       const std::vector<std::pair<int64_t, uint64_t>>& hashes, bool sent,
                       bool committed = false) {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(sync_id_);
    r.set_staged(staged);
    r.set_committed(committed);
    for (const auto& [bucket, hash] : hashes) {
      v1::BucketChecksum* c = r.add_checksums();
      c->set_bucket(bucket);
      c->set_hash(hash);
      c->set_sent(sent);
    }
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  }

  std::string s0_, s1_, d0_, sync_id_;
  std::map<std::string, uint64_t> tokens_;
  bool staged_capability_ = true;  // the receiver registers staged_syncs
};

TEST_F(SyncStagedTest, CommitsOnlyOnceEveryReceiverStagedThenSucceedsOnConfirmation) {
  SetUpStaged();
  auto defined = DefineStaged();
  ASSERT_TRUE(defined.ok()) << defined.status();
  ASSERT_EQ(defined->shadow_size(), 1);
  EXPECT_EQ(defined->shadow(0).group(), "dst");
  EXPECT_EQ(defined->shadow(0).shadow_bytes(), 32);
  auto plan = controller_->syncs().PlanTransfer([] {
    v1::PlanRequest r;
    r.set_transfer("t");
    return r;
  }());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->staging(), v1::STAGING_HOST_SHADOW);
  ASSERT_EQ(plan->shadow_size(), 1);
  EXPECT_EQ(plan->shadow(0).worker(), 2);

  auto a = Start(1);
  EXPECT_EQ(a[d0_].staging().mode(), v1::STAGING_HOST_SHADOW);
  EXPECT_TRUE(a[d0_].staging().checksums());
  EXPECT_TRUE(a[d0_].direct_written_by().empty()) << "staged syncs never write directly";
  Report(s0_, false, false, {{0, 11}}, /*sent=*/true);
  Report(s1_, false, false, {{1, 22}}, /*sent=*/true);
  EXPECT_FALSE(Status().commit_decided()) << "the receiver has not staged";
  EXPECT_FALSE(Pending(d0_).has_value());
  Report(d0_, /*staged=*/true, false, {{0, 11}, {1, 22}}, /*sent=*/false);
  v1::SyncStatus st = Status();
  EXPECT_TRUE(st.commit_decided());
  EXPECT_EQ(st.phase(), v1::SYNC_RUNNING) << "succeeds only once the receiver committed";
  EXPECT_EQ(st.buckets_verified(), 2);
  auto commit = Pending(d0_);
  ASSERT_TRUE(commit.has_value());
  ASSERT_TRUE(commit->has_commit());
  EXPECT_EQ(commit->commit().sync_id(), sync_id_);
  Report(d0_, false, /*committed=*/true, {}, false);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
}

// A worker tries a report again when its answer is lost (agent_report.cc):
// the same staged report, before or after the decision, counts once.
TEST_F(SyncStagedTest, AStagedReportDeliveredTwiceCountsOnceBeforeAndAfterTheDecision) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged().ok());
  Start(1);
  Report(s0_, false, false, {{0, 11}}, /*sent=*/true);
  Report(d0_, /*staged=*/true, false, {{0, 11}, {1, 22}}, /*sent=*/false);
  Report(d0_, /*staged=*/true, false, {{0, 11}, {1, 22}}, /*sent=*/false);
  EXPECT_EQ(Status().workers_staged(), 1);
  EXPECT_FALSE(Status().commit_decided());
  Report(s1_, false, false, {{1, 22}}, /*sent=*/true);
  ASSERT_TRUE(Status().commit_decided());
  Report(d0_, /*staged=*/true, false, {{0, 11}, {1, 22}}, /*sent=*/false);
  v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_RUNNING) << "a repeat is not the commit's report: " << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
  Report(d0_, false, /*committed=*/true, {}, false);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
}

// With a verify pass, a repeated staged report must not add its verify
// hashes twice (the comparison would find two destination hashes).
TEST_F(SyncStagedTest, AStagedReportDeliveredTwiceAddsItsVerifyHashesOnce) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged(/*checksums=*/true, /*verify=*/true).ok());
  Start(1);
  auto report = [&](const std::string& lease, int64_t bucket, uint64_t hash, bool sent, bool staged,
                    bool committed) {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(sync_id_);
    r.set_staged(staged);
    r.set_committed(committed);
    if (sent) {
      v1::BucketChecksum* c = r.add_checksums();
      c->set_bucket(bucket);
      c->set_hash(hash);
      c->set_sent(true);
    } else if (staged) {
      for (const auto& [b, h] : {std::pair<int64_t, uint64_t>{0, 11}, {1, 22}}) {
        v1::BucketChecksum* c = r.add_checksums();
        c->set_bucket(b);
        c->set_hash(h);
      }
    }
    r.set_verify_pass(true);
    v1::BucketChecksum* v = r.add_verify_checksums();
    v->set_bucket(bucket);
    v->set_hash(hash + 1000);
    v->set_sent(sent);
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  };
  report(s0_, 0, 11, /*sent=*/true, false, false);
  report(d0_, 0, 11, /*sent=*/false, /*staged=*/true, false);
  report(d0_, 0, 11, /*sent=*/false, /*staged=*/true, false);  // the retry
  report(s1_, 1, 22, /*sent=*/true, false, false);
  ASSERT_TRUE(Status().commit_decided());
  report(d0_, 0, 11, /*sent=*/false, /*staged=*/true, false);  // a retry after the decision
  report(d0_, 1, 22, /*sent=*/false, false, /*committed=*/true);
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
}

TEST_F(SyncStagedTest, AStagedReportGivenAgainWithOtherChecksumsFailsTheSync) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged().ok());
  Start(1);
  Report(d0_, /*staged=*/true, false, {{0, 11}, {1, 22}}, /*sent=*/false);
  Report(d0_, /*staged=*/true, false, {{0, 11}, {1, 23}}, /*sent=*/false);
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_THAT(st.error(), HasSubstr("reported staged twice, with other figures"));
}

TEST_F(SyncStagedTest, AChecksumMismatchFailsNamingBucketTensorAndBothWorkersAndAbortsTheReceiver) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged().ok());
  Start(1);
  Report(s0_, false, false, {{0, 11}}, true);
  Report(s1_, false, false, {{1, 22}}, true);
  Report(d0_, true, false, {{0, 11}, {1, 23}}, false);
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_FALSE(st.commit_decided());
  EXPECT_THAT(st.error(), HasSubstr("checksum mismatch: bucket 1 (tensor w)"));
  EXPECT_THAT(st.error(), HasSubstr("src/1"));
  EXPECT_THAT(st.error(), HasSubstr("dst/0"));
  EXPECT_EQ(st.failed_group(), "dst");
  auto abort = Pending(d0_);
  ASSERT_TRUE(abort.has_value());
  EXPECT_TRUE(abort->has_abort()) << "the staged receiver rolls back";
}

TEST_F(SyncStagedTest, AReceiverLostBeforeTheDecisionFailsTheSyncAfterItOnlyGoesUncommitted) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged(/*checksums=*/false).ok());
  Start(1);
  Report(s0_, false, false, {}, true);
  controller_->workers().CloseStream(d0_, tokens_[d0_], "killed");  // dies before staging
  v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st.failed_group(), "dst");
  auto abort = Pending(s1_);  // it had not reported: told to stop
  ASSERT_TRUE(abort.has_value());
  EXPECT_TRUE(abort->has_abort());

  // After the decision: the sync succeeds, the lost receiver listed.
  d0_ = RegisterWithBudget("c2", 0);
  tokens_[d0_] = *controller_->workers().OpenStream(d0_);
  Start(1);
  Report(s0_, false, false, {}, true);
  Report(s1_, false, false, {}, true);
  Report(d0_, true, false, {}, false);
  ASSERT_TRUE(Status().commit_decided());
  controller_->workers().CloseStream(d0_, tokens_[d0_], "killed");
  st = Status();
  // It may register again before the deadline plus its --decision_slack
  // and commit then (docs/staging.md): not given up yet.
  EXPECT_EQ(st.phase(), v1::SYNC_RUNNING) << st.error();
  EXPECT_EQ(st.uncommitted_size(), 0);
  // Restarted (its shadow gone): it hears the decision and says so.
  d0_ = RegisterWithBudget("c3", 0);
  v1::ReportResultRequest r;
  r.set_lease_id(d0_);
  r.set_sync_id(sync_id_);
  r.set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  r.set_message("holds no staged shadow of version 1");
  ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("dst/0"));
  EXPECT_THAT(st.uncommitted(0), HasSubstr("holds no staged shadow"));
}

TEST_F(SyncStagedTest, AReceiverReportingSuccessWithoutStagingFailsTheSync) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged(false).ok());
  Start(1);
  Report(d0_, /*staged=*/false, false, {}, false);
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_THAT(st.error(), HasSubstr("without staging"));
}

TEST_F(SyncStagedTest, AShadowOverAWorkersBudgetIsRefusedUpFrontNamingIt) {
  SetUpStaged(/*dst_budget=*/16);
  auto defined = DefineStaged();
  ASSERT_FALSE(defined.ok());
  EXPECT_EQ(defined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(defined.status().message(), HasSubstr("dst/0"));
  EXPECT_THAT(defined.status().message(), HasSubstr("needs 32 bytes of shadow memory"));
  EXPECT_THAT(defined.status().message(), HasSubstr("--staging_budget_bytes of 16"));
  // In place needs no shadow: the same workers define it.
  EXPECT_TRUE(controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer()).ok());
}

// Review findings (issue 20), each failing before its fix.

TEST_F(SyncStagedTest, ACancelAfterTheCommitDecisionIsRefusedAndTheVersionIsDelivered) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged(false).ok());
  Start(1);
  Report(s0_, false, false, {}, true);
  Report(s1_, false, false, {}, true);
  Report(d0_, true, false, {}, false);
  ASSERT_TRUE(Status().commit_decided());
  auto cancelled = controller_->syncs().Cancel(sync_id_, "changed my mind");
  ASSERT_FALSE(cancelled.ok()) << "the receivers commit whatever the trainer says";
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cancelled.status().message(), HasSubstr("the commit of version 1 was decided at"));
  EXPECT_THAT(cancelled.status().message(), HasSubstr("cannot be cancelled; wait for it"));
  EXPECT_EQ(Status().phase(), v1::SYNC_RUNNING);
  Report(d0_, false, /*committed=*/true, {}, false);
  EXPECT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
  const v1::GetStatusResponse all = controller_->syncs().GetStatus();
  ASSERT_EQ(all.transfers_size(), 1);
  EXPECT_EQ(all.transfers(0).last_success_version(), 1) << "every replica serves it";
}

TEST_F(SyncStagedTest, ACancelBeforeTheDecisionStillRollsTheReceiverBack) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged(false).ok());
  Start(1);
  Report(d0_, true, false, {}, false);
  auto cancelled = controller_->syncs().Cancel(sync_id_, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->phase(), v1::SYNC_CANCELLED);
  auto abort = Pending(d0_);
  ASSERT_TRUE(abort.has_value());
  EXPECT_TRUE(abort->has_abort());
}

TEST_F(SyncStagedTest, EachNetworkBucketNeedsExactlyOneSentAndOneReceivedChecksum) {
  SetUpStaged();
  ASSERT_TRUE(DefineStaged().ok());
  Start(1);
  ReportChecksums(s0_, false, {{0, 11}}, true);
  ReportChecksums(s1_, false, {{1, 22}}, true);
  // Bucket 0 twice, bucket 1 never: as many received as sent.
  ReportChecksums(d0_, true, {{0, 11}, {0, 11}}, false);
  v1::SyncStatus st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_FALSE(st.commit_decided());
  EXPECT_EQ(st.error_code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.error(), HasSubstr("bucket 0 (tensor w)"));
  EXPECT_THAT(st.error(), HasSubstr("2 received checksums"));
  EXPECT_THAT(st.error(), HasSubstr("dst/0"));

  ASSERT_TRUE(Pending(d0_).has_value());  // its abort
  Start(1);                               // a checksum from a worker that did not send the bucket
  ReportChecksums(s0_, false, {{0, 11}, {1, 22}}, true);
  ReportChecksums(s1_, false, {}, true);
  ReportChecksums(d0_, true, {{0, 11}, {1, 22}}, false);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_THAT(st.error(), HasSubstr("bucket 1"));
  EXPECT_THAT(st.error(), HasSubstr("expected exactly one from its sender"));
}

TEST_F(SyncStagedTest, AStagedTimeoutBlamesOnlyTheWorkersThatDidNotReport) {
  config_.failure_grace = absl::Milliseconds(50);
  Restart();
  SetUpStaged();
  ASSERT_TRUE(DefineStaged(false).ok());
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  req.set_deadline_ms(200);
  auto started = controller_->syncs().StartSync(req);
  ASSERT_TRUE(started.ok()) << started.status();
  sync_id_ = started->sync_id();
  for (const auto& l : {s0_, s1_, d0_}) Next(l, tokens_[l]);
  Report(s0_, false, false, {}, true);
  Report(d0_, true, false, {}, false);  // staged, waiting for the decision
  const v1::SyncStatus st = TickUntilEnded(sync_id_, {s0_, s1_, d0_}, absl::Seconds(10));
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_THAT(st.error(), HasSubstr("did not report: "));
  EXPECT_THAT(st.error(), HasSubstr("src/1"));
  EXPECT_THAT(st.error(), Not(HasSubstr("dst/0"))) << "it reported staged";
  EXPECT_EQ(st.failed_worker(), 1);
}

TEST_F(SyncStagedTest, AReceiverWithoutTheStagedSyncsCapabilityIsRefusedNamingIt) {
  staged_capability_ = false;
  SetUpStaged();
  auto defined = DefineStaged();
  ASSERT_FALSE(defined.ok());
  EXPECT_EQ(defined.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(defined.status().message(), HasSubstr("dst/0"));
  EXPECT_THAT(defined.status().message(), HasSubstr("'staged_syncs'"));
  EXPECT_TRUE(controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer()).ok())
      << "in place needs no capability";

  // Defined over a capable receiver, synced over one that is not.
  staged_capability_ = true;
  controller_->workers().CloseStream(d0_, tokens_[d0_], "replaced");
  d0_ = RegisterWithBudget("c2", 0);
  tokens_[d0_] = *controller_->workers().OpenStream(d0_);
  ASSERT_TRUE(DefineStaged().ok());
  controller_->workers().CloseStream(d0_, tokens_[d0_], "replaced");
  staged_capability_ = false;
  d0_ = RegisterWithBudget("c3", 0);
  tokens_[d0_] = *controller_->workers().OpenStream(d0_);
  auto started = StartSync(1);
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(started.status().message(), HasSubstr("dst/0"));
}

}  // namespace
}  // namespace wsync::controller
