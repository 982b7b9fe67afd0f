// SyncCoordinator when syncs fail: errors, aborts, lost leases and peers,
// cancels (the real planner, workers simulated by calls).
#include <map>

#include "absl/time/clock.h"
#include "controller/server/controller.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;
using SyncCoordinatorTest = controller_testing::CoordinatorFixture;

TEST_F(SyncCoordinatorTest, ATrainerCancelsOnlyItsOwnSyncs) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  for (const auto& l : {s0, s1, d0}) ASSERT_TRUE(controller_->workers().OpenStream(l).ok());
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  auto started = controller_->syncs().StartSync(req, {"token:alice", false});
  ASSERT_TRUE(started.ok()) << started.status();
  auto other = controller_->syncs().Cancel(started->sync_id(), "", {"token:carol", false});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("token:alice"));
  EXPECT_THAT(other.status().message(), HasSubstr("token:carol"));
  auto own = controller_->syncs().Cancel(started->sync_id(), "", {"token:alice", false});
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->phase(), v1::SYNC_CANCELLED);
}

TEST_F(SyncCoordinatorTest, AnAbortedSyncSendsTheOpListAgainToWorkersThatDidNotReport) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  auto first = StartSync(1);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const auto& l : {s0, s1, d0}) EXPECT_TRUE(Next(l, tokens[l]).has_plan());
  // s0 ran it (and cached the op list); the others may drop it unrun.
  v1::ReportResultRequest r;
  r.set_lease_id(s0);
  r.set_sync_id(first->sync_id());
  ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  ASSERT_TRUE(controller_->syncs().Cancel(first->sync_id(), "test").ok());
  for (const auto& l : {s1, d0}) {
    auto a = controller_->workers().NextAssignment(l, tokens[l], absl::Seconds(1));
    ASSERT_TRUE(a.ok() && a->has_value());
    EXPECT_TRUE((*a)->has_abort());
  }
  auto second = StartSync(1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(Next(s0, tokens[s0]).has_plan()) << "s0 ran the first sync: it holds the list";
  for (const auto& l : {s1, d0}) {
    EXPECT_TRUE(Next(l, tokens[l]).has_plan()) << "the aborted assignment may never have run";
  }
}

TEST_F(SyncCoordinatorTest, FirstErrorFailsSyncAndAbortsTheOthers) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  auto started = controller_->syncs().StartSync(req);
  ASSERT_TRUE(started.ok()) << started.status();
  for (const auto& l : {s0, s1, d0}) Next(l, tokens[l]);
  v1::ReportResultRequest r;
  r.set_lease_id(d0);
  r.set_sync_id(started->sync_id());
  r.set_code(static_cast<int>(absl::StatusCode::kInternal));
  r.set_message("disk on fire");
  r.set_round(0);
  r.set_peer(1);
  ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st->failed_group(), "dst");
  EXPECT_EQ(st->failed_rank(), 0);
  EXPECT_EQ(st->failed_peer(), 1);
  EXPECT_NE(st->error().find("disk on fire"), std::string::npos);
  for (const auto& l : {s0, s1}) {
    auto a = controller_->workers().NextAssignment(l, tokens[l], absl::Seconds(1));
    ASSERT_TRUE(a.ok() && a->has_value());
    EXPECT_TRUE((*a)->has_abort());
  }
  // The failed version was not recorded: it may be retried.
  auto retry = controller_->syncs().StartSync(req);
  EXPECT_TRUE(retry.ok()) << retry.status();
}

TEST_F(SyncCoordinatorTest, MissedHeartbeatsExpireTheLeaseAndFailTheSync) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  auto started = controller_->syncs().StartSync(req);
  ASSERT_TRUE(started.ok()) << started.status();
  // s0 and d0 keep heartbeating; s1 is silent.
  const absl::Time until = absl::Now() + absl::Seconds(1);
  while (absl::Now() < until) {
    ASSERT_TRUE(controller_->workers().Heartbeat(s0).ok());
    ASSERT_TRUE(controller_->workers().Heartbeat(d0).ok());
    controller_->Tick();
    auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Milliseconds(20));
    if (st.ok() && st->phase() != v1::SYNC_RUNNING) break;
  }
  auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Milliseconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st->failed_group(), "src");
  EXPECT_EQ(st->failed_rank(), 1);
  EXPECT_NE(st->error().find("lease expired"), std::string::npos) << st->error();
  EXPECT_EQ(controller_->workers().Heartbeat(s1).status().code(), absl::StatusCode::kNotFound);
}

// A trainer worker dies mid-sync: a receiver reports the lost connection
// first, the controller declares the trainer lost a lease TTL later (past
// the failure grace, here none); the sync then names the trainer, not the
// receiver, as its cause.
TEST_F(SyncCoordinatorTest, APeerDeclaredLostAfterTheFailureBecomesItsCause) {
  config_.failure_grace = absl::ZeroDuration();
  Restart();
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  std::map<std::string, int32_t> worker;
  for (const auto& l : {s0, s1, d0}) worker[l] = Next(l, tokens[l]).worker();
  v1::ReportResultRequest r;
  r.set_lease_id(d0);
  r.set_sync_id(started->sync_id());
  r.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  r.set_message("round 0: recv from peer failed (peer connection lost?)");
  r.set_peer(worker[s0]);
  ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  auto first = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->failed_group(), "dst");
  // s0 is silent from here on (its lease TTL is 300 ms); the others heartbeat.
  const absl::Time silent_until = absl::Now() + absl::Seconds(2);
  absl::StatusOr<v1::SyncStatus> st;
  while (absl::Now() < silent_until) {
    ASSERT_TRUE(controller_->workers().Heartbeat(s1).ok());
    ASSERT_TRUE(controller_->workers().Heartbeat(d0).ok());
    controller_->Tick();
    st = controller_->syncs().WaitSync(started->sync_id(), absl::Milliseconds(1));
    if (st.ok() && st->failed_group() == "src") break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->failed_group(), "src");
  EXPECT_EQ(st->failed_rank(), 0);
  EXPECT_NE(st->error().find("was lost"), std::string::npos) << st->error();
  EXPECT_NE(st->error().find("first report"), std::string::npos) << st->error();
  EXPECT_NE(st->error().find("peer connection lost"), std::string::npos) << st->error();
}

}  // namespace
}  // namespace wsync::controller
