// Blame (sync_coordinator.h): the first cause of a failure names the worker
// that died, stalled or erred, not a healthy peer that reported first.
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

class SyncBlameTest : public controller_testing::CoordinatorFixture {
 protected:
  // src/0, src/1, dst/0 registered with open streams, transfer "t" defined.
  void SetUpWorkers() {
    s0_ = Register("a", "src", 0, 2, 16);
    s1_ = Register("b", "src", 1, 2, 16);
    d0_ = Register("c", "dst", 0, 1, 32);
    for (const auto& l : {s0_, s1_, d0_}) tokens_[l] = *controller_->workers().OpenStream(l);
    DefineSimple();
  }
  // Starts version `v` (deadline `deadline_ms`, 0: the default) and takes
  // every worker's assignment; returns the sync id.
  std::string Start(int64_t v, int64_t deadline_ms = 0) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(v);
    req.set_deadline_ms(deadline_ms);
    auto started = controller_->syncs().StartSync(req);
    EXPECT_TRUE(started.ok()) << started.status();
    for (const auto& l : {s0_, s1_, d0_}) worker_[l] = Next(l, tokens_[l]).worker();
    return started.ok() ? started->sync_id() : "";
  }

  std::string s0_, s1_, d0_;
  std::map<std::string, uint64_t> tokens_;
  std::map<std::string, int32_t> worker_;
};

// The attack of issue 18: a killed worker's peer reports "recv from peer N"
// first (naming some peer, not necessarily the dead one); the dead worker's
// stream closes a moment later. The sync names the dead worker.
TEST_F(SyncBlameTest, AKilledWorkerIsTheCauseNotThePeerThatReportedFirst) {
  config_.failure_grace = absl::Seconds(5);
  Restart();
  SetUpWorkers();
  const std::string id = Start(1);
  ReportFailed(d0_, id, absl::StatusCode::kUnavailable,
               "gloo transport rank 2: recv from peer 0 failed (peer connection lost?)",
               /*peer=*/-1);
  auto pending = controller_->syncs().WaitSync(id, absl::Milliseconds(50));
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->phase(), v1::SYNC_RUNNING) << "waits for the cause: " << pending->error();
  controller_->workers().CloseStream(s1_, tokens_[s1_], "stream closed (process killed)");
  auto st = controller_->syncs().WaitSync(id, absl::Seconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st->failed_group(), "src");
  EXPECT_EQ(st->failed_rank(), 1);
  EXPECT_EQ(st->failed_worker(), worker_[s1_]);
  EXPECT_NE(st->error().find("lost"), std::string::npos) << st->error();
  EXPECT_NE(st->error().find("first report"), std::string::npos) << st->error();
}

// A frozen worker (SIGSTOP) says nothing; the others stop at the deadline
// and report DEADLINE_EXCEEDED. The sync names the one that did not report,
// whichever report or tick comes first.
TEST_F(SyncBlameTest, ADeadlineNamesTheWorkersThatDidNotReport) {
  config_.failure_grace = absl::Seconds(2);
  Restart();
  SetUpWorkers();
  const std::string id = Start(1, /*deadline_ms=*/200);
  absl::SleepFor(absl::Milliseconds(250));
  controller_->Tick();  // past the deadline: waits for the workers' reports
  ReportFailed(s0_, id, absl::StatusCode::kDeadlineExceeded,
               "round deadline passed with pending peers [2]");
  ReportFailed(s1_, id, absl::StatusCode::kDeadlineExceeded,
               "round deadline passed with pending peers [0]");
  const v1::SyncStatus st = TickUntilEnded(id, {s0_, s1_, d0_}, absl::Seconds(5));
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st.error_code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(st.failed_group(), "dst") << st.error();
  EXPECT_EQ(st.failed_rank(), 0);
  EXPECT_NE(st.error().find("did not report: worker dst/0"), std::string::npos) << st.error();
  EXPECT_EQ(st.error().find("src/1 ["), std::string::npos) << "src/1 reported: " << st.error();
}

// When no worker reports at all by the deadline (plus the grace), all are
// named, the first as the cause.
TEST_F(SyncBlameTest, ADeadlineWithNoReportNamesEveryWorker) {
  config_.failure_grace = absl::Milliseconds(100);
  Restart();
  SetUpWorkers();
  const std::string id = Start(1, /*deadline_ms=*/100);
  const absl::Time start = absl::Now();
  const v1::SyncStatus st = TickUntilEnded(id, {s0_, s1_, d0_}, absl::Seconds(5));
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (const char* w : {"src/0", "src/1", "dst/0"}) {
    EXPECT_NE(st.error().find(w), std::string::npos) << w << ": " << st.error();
  }
}

// A failure about peers with no loss to explain it settles on the reporter
// once the grace passed; its own failure (not about peers) at once.
TEST_F(SyncBlameTest, WithoutALossTheReporterIsBlamedAfterTheGraceAndOwnErrorsAtOnce) {
  config_.failure_grace = absl::Milliseconds(200);
  Restart();
  SetUpWorkers();
  std::string id = Start(1);
  const absl::Time reported = absl::Now();
  ReportFailed(d0_, id, absl::StatusCode::kUnavailable, "recv from peer 0 failed");
  v1::SyncStatus st = TickUntilEnded(id, {s0_, s1_, d0_}, absl::Seconds(5));
  EXPECT_GE(absl::Now() - reported, absl::Milliseconds(190));
  EXPECT_EQ(st.failed_group(), "dst");
  EXPECT_NE(st.error().find("not reported yet"), std::string::npos) << st.error();
  for (const auto& l : {s0_, s1_}) {  // their aborts
    auto a = controller_->workers().NextAssignment(l, tokens_[l], absl::Seconds(1));
    ASSERT_TRUE(a.ok() && a->has_value() && (*a)->has_abort());
  }

  id = Start(1);
  ReportFailed(s1_, id, absl::StatusCode::kInvalidArgument, "bad buffer");
  auto own = controller_->syncs().WaitSync(id, absl::Milliseconds(1));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(own->failed_group(), "src");
  EXPECT_EQ(own->failed_rank(), 1);
}

// Every other worker reported: nothing is left to wait for.
TEST_F(SyncBlameTest, AFailureSettlesAtOnceWhenEveryWorkerReported) {
  config_.failure_grace = absl::Seconds(30);
  Restart();
  SetUpWorkers();
  const std::string id = Start(1);
  ReportFailed(d0_, id, absl::StatusCode::kUnavailable, "recv from peer 0 failed");
  v1::ReportResultRequest ok;
  for (const auto& l : {s0_, s1_}) {
    ok.set_lease_id(l);
    ok.set_sync_id(id);
    ASSERT_TRUE(controller_->syncs().ReportResult(ok).ok());
  }
  auto st = controller_->syncs().WaitSync(id, absl::Milliseconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st->failed_group(), "dst");
}

}  // namespace
}  // namespace wsync::controller
