// Held replicas in rolling waves (docs/staging.md, "An owner holding syncs
// off"): a multi-rank replica waits for a wave only once every rank of it
// is admitted, a restored held rank that never comes back is listed for its
// loss, a held report from a lease outside the sync changes nothing, and
// --decision_slack is bounded. Workers are simulated by calls.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/shadow_extents.h"
#include "common/staging_limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/rollout_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class SyncHeldTest : public SyncRolloutTest {
 protected:
  // dst/0 and dst/1 form replica "tp" (TP = 2), dst/2 and dst/3 are 1-rank
  // replicas "b" and "c" (their owners' labels).
  void LabelReplicas() {
    const char* labels[kReplicas] = {"tp", "tp", "b", "c"};
    for (int r = 0; r < kReplicas; ++r) {
      google::protobuf::RepeatedPtrField<v1::ServingReport> reports;
      v1::ServingReport* rep = reports.Add();
      rep->set_group("dst");
      rep->set_state(v1::SERVING_STATE_SERVING);
      rep->set_replica(labels[r]);
      rep->set_replica_ranks(r < 2 ? 2 : 1);
      ASSERT_TRUE(controller_->RecordServing(dst_[r], reports).ok());
    }
  }
};

// Session 16's gap: the first rank of a TP = 2 replica admitted put the
// replica in the next wave, whose CommitSync reached its still-held sibling
// too (which kept it and copied as soon as it was admitted, while the
// controller showed it waiting, beside another replica's wave).
TEST_F(SyncHeldTest, ATwoRankReplicaWaitsForAWaveUntilBothRanksAreAdmitted) {
  RegisterAll();
  LabelReplicas();
  ASSERT_TRUE(Define(/*max_unavailable=*/1, /*replica_ranks=*/0).ok());
  RunToDecision(1);
  EXPECT_THAT(Committing(), ElementsAre(0, 1)) << "replica tp: both ranks at once";
  HeldReport(dst_[0], /*held=*/true);
  HeldReport(dst_[1], /*held=*/true);
  EXPECT_THAT(Committing(), ElementsAre(2)) << "tp held: replica b's wave";
  HeldReport(dst_[0], /*held=*/false);  // one rank admitted, its sibling still held
  v1::SyncStatus st = Status();
  ASSERT_EQ(st.rollout().replicas_size(), 3);
  EXPECT_EQ(st.rollout().replicas(0).state(), "held") << "a rank of it is still held";
  Report(dst_[2], false, true);
  EXPECT_THAT(Committing(), ElementsAre(3)) << "replica c, not the half-admitted tp";
  Report(dst_[3], false, true);
  EXPECT_TRUE(Committing().empty()) << "a CommitSync went to a replica with a held rank";
  HeldReport(dst_[1], /*held=*/false);  // the whole replica is admitted
  EXPECT_THAT(Committing(), ElementsAre(0, 1));
  Report(dst_[0], false, true);
  Report(dst_[1], false, true);
  st = Status();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
}

// Session 16's gap: a restored held rank that never registered again was
// listed as "owner held syncs off" at the deadline, hiding its loss.
TEST_F(SyncHeldTest, ARestoredHeldRankThatNeverComesBackIsListedForItsLoss) {
  RegisterAll();
  ASSERT_TRUE(Define(/*max_unavailable=*/0).ok());
  RunToDecision(1, false, /*deadline_ms=*/1500);
  HeldReport(dst_[0], /*held=*/true);
  for (int r : {1, 2, 3}) Report(dst_[r], false, true);
  Restart();
  // dst/0's worker is gone for good: the others register again.
  src_ = Join("s", "src", 0, 1).lease_id();
  std::vector<std::string> alive = {src_};
  for (int r = 1; r < kReplicas; ++r) {
    alive.push_back(Join(absl::StrCat("d", r), "dst", r, kReplicas).lease_id());
    Report(alive.back(), false, true);  // confirms again (its commit is decided)
  }
  const v1::SyncStatus st = TickUntilEnded(sync_id_, alive, absl::Seconds(10));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  ASSERT_EQ(st.uncommitted_size(), 1);
  EXPECT_THAT(st.uncommitted(0), HasSubstr("not registered again since the controller restarted"));
  EXPECT_THAT(st.uncommitted(0), Not(HasSubstr("held syncs off until")));
}

TEST_F(SyncHeldTest, AHeldReportFromALeaseOutsideTheSyncIsRefusedAndChangesNothing) {
  RegisterAll();
  const std::string outsider = Join("x", "spare", 0, 1).lease_id();
  ASSERT_TRUE(Define(/*max_unavailable=*/1).ok());
  RunToDecision(1);
  EXPECT_THAT(Committing(), ElementsAre(0));
  v1::ReportResultRequest r;
  r.set_lease_id(outsider);
  r.set_sync_id(sync_id_);
  r.set_commit_held(true);
  const absl::Status refused = controller_->syncs().ReportResult(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("takes no part"));
  const v1::SyncStatus st = Status();
  EXPECT_EQ(st.rollout().replicas(0).state(), "committing");
  EXPECT_EQ(st.rollout().committing(), 1);
  EXPECT_TRUE(Committing().empty()) << "an outsider's held report started the next wave";
  Report(dst_[0], false, true);
  FinishRollout();
  EXPECT_EQ(Status().phase(), v1::SYNC_SUCCEEDED);
}

// A huge --decision_slack would push a lost receiver's wait (deadline +
// slack) out of range: refused over the documented limit (one hour).
TEST_F(SyncHeldTest, ADecisionSlackOverItsLimitIsRefusedAtRegistration) {
  controller_testing::Joining j;
  j.capabilities = {kStagedSyncsCapability};
  for (int64_t ms : {std::numeric_limits<int64_t>::max(), kMaxDecisionSlackMs + 1}) {
    j.decision_slack_ms = ms;
    auto resp = controller_->RegisterWorker(Registration("big", "dst", 0, 1, 32, j), "", "");
    ASSERT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << ms;
    EXPECT_THAT(resp.status().message(), HasSubstr("--decision_slack"));
  }
  j.decision_slack_ms = kMaxDecisionSlackMs;
  EXPECT_TRUE(controller_->RegisterWorker(Registration("big", "dst", 0, 1, 32, j), "", "").ok());
}

}  // namespace
}  // namespace wsync::controller
