// Staged syncs on the controller (docs/staging.md): the two phases, the
// checksum comparison, the commit rule for a receiver lost before and after
// the decision, and the shadow budget, with workers simulated by calls.
#include <map>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

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
    v1::RegisterWorkerRequest req;
    req.set_instance_id(instance);
    req.set_staging_budget_bytes(budget);
    auto* m = req.add_memberships();
    m->set_group("dst");
    m->set_rank(0);
    m->set_group_size(1);
    auto* b = req.add_buffers();
    b->set_group("dst");
    b->set_name("w");
    b->set_dtype(v1::FP32);
    b->set_bytes(32);
    auto resp = controller_->workers().RegisterWorker(req, "", "");
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->lease_id() : "";
  }

  absl::StatusOr<v1::DefineTransferResponse> DefineStaged(bool checksums = true) {
    v1::DefineTransferRequest req = controller_testing::SimpleTransfer();
    req.mutable_spec()->mutable_staging()->set_mode(v1::STAGING_HOST_SHADOW);
    req.mutable_spec()->mutable_staging()->set_checksums(checksums);
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

  std::string s0_, s1_, d0_, sync_id_;
  std::map<std::string, uint64_t> tokens_;
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
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("dst/0"));
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

}  // namespace
}  // namespace wsync::controller
