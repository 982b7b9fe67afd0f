// SyncCoordinator (with the registry and rendezvous it drives, composed by
// Controller): the real planner, workers simulated by calls.
#include <atomic>
#include <iostream>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/bucket_steps.h"
#include "controller/server/controller.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;
using SyncCoordinatorTest = controller_testing::CoordinatorFixture;

TEST_F(SyncCoordinatorTest, SyncSendsOpListOncePerPlanKeyAndVersionsMoveForward) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  for (int64_t v = 1; v <= 2; ++v) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(v);
    auto started = controller_->syncs().StartSync(req);
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_TRUE(started->plan_cache_hit());
    for (const auto& l : {s0, s1, d0}) {
      v1::SyncAssignment a = Next(l, tokens[l]);
      EXPECT_EQ(a.has_plan(), v == 1) << "op list only with the first sync of a plan key";
      EXPECT_EQ(a.version(), v);
      v1::ReportResultRequest r;
      r.set_lease_id(l);
      r.set_sync_id(a.sync_id());
      ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
    }
    auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  }
  v1::SyncRequest old;
  old.set_transfer("t");
  old.set_version(2);
  EXPECT_EQ(controller_->syncs().StartSync(old).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plans_->misses(), 1);
}

// Issue 18: forged reports claimed bytes no plan writes. A report may claim
// at most the plan's bytes into its worker.
TEST_F(SyncCoordinatorTest, ReportsClaimingMoreBytesThanThePlanWritesAreRefused) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  for (const auto& l : {s0, s1, d0}) ASSERT_TRUE(controller_->workers().OpenStream(l).ok());
  DefineSimple();
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  v1::ReportProgressRequest p;
  p.set_lease_id(d0);
  p.set_sync_id(started->sync_id());
  p.set_bytes_done(33);
  absl::Status too_many = controller_->syncs().ReportProgress(p);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_THAT(too_many.message(), HasSubstr("worker dst/0"));
  EXPECT_THAT(too_many.message(), HasSubstr("32 bytes"));
  v1::ReportResultRequest r;
  r.set_lease_id(s0);  // a source: nothing is written into it
  r.set_sync_id(started->sync_id());
  r.set_bytes_done(1);
  EXPECT_EQ(controller_->syncs().ReportResult(r).code(), absl::StatusCode::kInvalidArgument);
  r.set_bytes_done(0);
  EXPECT_TRUE(controller_->syncs().ReportResult(r).ok());
  r.set_lease_id(d0);
  r.set_bytes_done(32);
  EXPECT_TRUE(controller_->syncs().ReportResult(r).ok());
}

// A trainer cancels only the syncs of the transfers it owns; an admin any
// (docs/security.md). An unowned transfer is claimed by its first trainer.
TEST_F(SyncCoordinatorTest, ASteadySyncReusesItsBindingUntilARegistrationChanges) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  auto run = [&](int64_t v) {
    auto started = StartSync(v);
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_TRUE(started->plan_cache_hit());
    for (const auto& l : {s0, s1, d0}) {
      v1::ReportResultRequest r;
      r.set_lease_id(l);
      r.set_sync_id(Next(l, tokens[l]).sync_id());
      ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
    }
    auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  };
  run(1);
  EXPECT_EQ(plans_->reused(), 0);
  run(2);
  run(3);
  EXPECT_EQ(plans_->reused(), 2) << "bound and planned once, reused";
  // A redefinition binds afresh.
  DefineSimple();
  run(4);
  EXPECT_EQ(plans_->reused(), 2) << "not the old binding";
  // The destination now holds a smaller buffer: the next sync binds afresh
  // and refuses, instead of reusing what was checked before.
  v1::UpdateBuffersRequest update;
  update.set_lease_id(d0);
  auto* b = update.add_buffers();
  b->set_group("dst");
  b->set_name("w");
  b->set_dtype(v1::FP32);
  b->set_bytes(8);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  auto refused = StartSync(5);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("dst"), std::string::npos) << refused.status();
  EXPECT_EQ(plans_->reused(), 2);
}

TEST_F(SyncCoordinatorTest, TransportIsNcclWhenEveryWorkerRunsTheGpuPlane) {
  const std::vector<v1::TransportKind> gpu = {v1::TRANSPORT_NCCL};
  const std::string s0 = Register("a", "src", 0, 2, 16, gpu);
  const std::string s1 = Register("b", "src", 1, 2, 16, gpu);
  const std::string d0 = Register("c", "dst", 0, 1, 32, gpu);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  ASSERT_TRUE(StartSync(1).ok());
  for (const auto& l : {s0, s1, d0}) {
    const v1::SyncAssignment a = Next(l, tokens[l]);
    ASSERT_TRUE(a.has_transport());
    EXPECT_EQ(a.transport().kind(), v1::TRANSPORT_NCCL);
    EXPECT_EQ(a.transport().size(), 3);
  }
}

TEST_F(SyncCoordinatorTest, WorkersWithoutACommonTransportFailTheSyncNamingBoth) {
  const std::vector<v1::TransportKind> gpu = {v1::TRANSPORT_NCCL};
  const std::string s0 = Register("a", "src", 0, 2, 16, gpu);
  const std::string s1 = Register("b", "src", 1, 2, 16, gpu);
  const std::string d0 = Register("c", "dst", 0, 1, 32, {v1::TRANSPORT_GLOO});
  for (const auto& l : {s0, s1, d0}) ASSERT_TRUE(controller_->workers().OpenStream(l).ok());
  DefineSimple();
  auto started = StartSync(1);
  ASSERT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition) << started.status();
  const std::string msg(started.status().message());
  EXPECT_NE(msg.find("src/0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dst/0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device"), std::string::npos) << msg;
}

TEST_F(SyncCoordinatorTest, RendezvousKeysLiveInTheGenerationScope) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  Register("b", "src", 1, 2, 16);
  Register("c", "dst", 0, 1, 32);
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  ASSERT_TRUE(controller_->syncs().StartSync(req).ok());
  v1::KvSetRequest set;
  set.set_lease_id(s0);
  set.set_key("t/1/rank0");
  set.set_value("addr");
  ASSERT_TRUE(controller_->rendezvous().Set(set).ok());
  set.set_key("t/7/rank0");
  EXPECT_EQ(controller_->rendezvous().Set(set).code(), absl::StatusCode::kFailedPrecondition);
  v1::KvGetRequest get;
  get.set_lease_id(s0);
  get.add_keys("t/1/rank0");
  auto got = controller_->rendezvous().Get(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->values(0), "addr");
  get.add_keys("t/1/rank1");
  get.set_timeout_ms(50);
  auto missing = controller_->rendezvous().Get(get);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("t/1/rank1"), std::string::npos);
}

// A worker's --staging_limit_bytes (sent at registration) caps the plan's
// per-round staging: the plan fits it, and one that cannot is refused when
// the transfer is defined, naming the worker.
TEST_F(SyncCoordinatorTest, StagingLimitsCapThePlanAndAnImpossibleOneIsRefusedAtDefine) {
  constexpr int64_t kElems = 8192;  // 32 KiB, all received by dst/0
  Register("a", "src", 0, 2, kElems * 2);
  Register("b", "src", 1, 2, kElems * 2);
  const std::string d0 = Register("c", "dst", 0, 1, kElems * 4, {}, 4096);
  auto defined = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer(kElems));
  ASSERT_TRUE(defined.ok()) << defined.status();
  auto plan = FullPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->summary().num_rounds(), 1) << "32 KiB over a 4 KiB cap takes rounds";
  for (const v1::RankPlan& rp : plan->plan().ranks()) {
    for (const v1::Round& round : rp.rounds()) {
      EXPECT_LE(round.staging_bytes(), 4096)
          << "worker " << rp.worker() << " round " << round.index();
    }
  }
  ASSERT_TRUE(controller_->workers().OpenStream(d0).ok());
  ASSERT_TRUE(StartSync(1).ok());

  // Below 256 bytes no round can stage anything: refused at DefineTransfer.
  Restart();
  Register("a", "src", 0, 2, kElems * 2);
  Register("b", "src", 1, 2, kElems * 2, {}, 100);
  Register("c", "dst", 0, 1, kElems * 4);
  auto refused = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer(kElems));
  ASSERT_FALSE(refused.ok());
  const std::string msg(refused.status().message());
  EXPECT_NE(msg.find("src/1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[worker 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--staging_limit_bytes 100"), std::string::npos) << msg;
}

// A step latency plans steps inside rounds only when every worker of the
// transfer runs them: with one older worker (no kBucketStepsCapability) the
// transfer is planned with round barriers, not refused, and with steps once
// that worker registers again, upgraded.
TEST_F(SyncCoordinatorTest, StepsArePlannedOnlyWhenEveryWorkerRunsThem) {
  constexpr int kReceivers = 16;
  constexpr int64_t kElems = int64_t{2} << 20;  // 8 MiB of fp32, fanned out
  v1::DefineTransferRequest req;
  req.set_name("t");
  req.set_source_group("src");
  req.set_destination_group("dst");
  *req.mutable_spec()->mutable_source()->add_tensors() =
      controller_testing::Tensor(1, false, kElems);
  *req.mutable_spec()->mutable_destination()->add_tensors() =
      controller_testing::Tensor(kReceivers, false, kElems);
  // plan_steps_test's scaled fan-out: NIC 50 GB/s, L = 12.5 us, l = 2.5 us.
  v1::LinkModel* link = req.mutable_spec()->mutable_options()->mutable_link_model();
  link->set_nic_bytes_per_second(50e9);
  link->set_round_latency_seconds(12.5e-6);
  link->set_step_latency_seconds(2.5e-6);
  for (const bool older_receiver : {false, true}) {
    SCOPED_TRACE(older_receiver ? "dst/3 without steps" : "every worker with steps");
    Restart();
    controller_testing::Joining steps;
    steps.capabilities = {kBucketStepsCapability};
    Join("a", "src", 0, 1, kElems * 4, steps);
    std::string d3_lease;
    for (int r = 0; r < kReceivers; ++r) {
      const bool older = older_receiver && r == 3;
      v1::RegisterWorkerResponse joined =
          Join("d" + std::to_string(r), "dst", r, kReceivers, kElems * 4,
               older ? controller_testing::Joining() : steps);
      if (r == 3) d3_lease = joined.lease_id();
    }
    auto defined = controller_->syncs().DefineTransfer(req);
    ASSERT_TRUE(defined.ok()) << defined.status();
    auto plan = FullPlan();
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(HasBucketSteps(plan->plan()), !older_receiver);
    if (!older_receiver) continue;
    auto upgraded = controller_->RegisterWorker(
        Registration("d3", "dst", 3, kReceivers, kElems * 4, steps), "", d3_lease);
    ASSERT_TRUE(upgraded.ok()) << upgraded.status();
    EXPECT_FALSE(controller_->workers().IsAlive(d3_lease)) << "replaced by the upgraded one";
    plan = FullPlan();
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(HasBucketSteps(plan->plan())) << "dst/3 registered again with steps";
  }
}

// A worker that registers again with a tighter limit is held to it at the
// next Sync (the first point its new limit is known).
TEST_F(SyncCoordinatorTest, ATighterLimitAfterDefineIsRefusedAtSync) {
  Register("a", "src", 0, 2, 16);
  Register("b", "src", 1, 2, 16);
  Register("c", "dst", 0, 1, 32);
  DefineSimple();
  Register("c", "dst", 0, 1, 32, {}, 10);  // same instance: replaces its lease
  auto started = StartSync(1);
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("dst/0"), std::string::npos) << started.status();
  EXPECT_NE(started.status().message().find("--staging_limit_bytes 10"), std::string::npos)
      << started.status();
}

// A DefineTransfer that completes while a Sync plans the previous spec must
// not let that sync run the old plan under the new definition: either the
// sync is refused (ABORTED, retry) or it runs the definition in force.
TEST_F(SyncCoordinatorTest, ASyncNeverRunsASpecRedefinedWhilePlanning) {
  Register("a", "src", 0, 2, 16);
  Register("b", "src", 1, 2, 16);
  Register("c", "dst", 0, 1, 32);
  auto first = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Mutex define_mu;
  std::string defined_key = first->plan_key();  // of the definition in force
  std::atomic<bool> stop{false};
  std::thread redefine([&] {
    for (int i = 0; !stop.load(); ++i) {
      absl::MutexLock lock(&define_mu);
      auto r = controller_->syncs().DefineTransfer(
          controller_testing::SimpleTransfer(i % 2 == 0 ? 4 : 8));
      if (r.ok()) defined_key = r->plan_key();
    }
  });
  int started = 0, aborted = 0;
  const absl::Time until = absl::Now() + absl::Seconds(1);
  while (absl::Now() < until) {
    auto sync = StartSync(1);
    if (!sync.ok()) {
      // Refused while planning, or a DefineTransfer committed in between.
      ASSERT_TRUE(sync.status().code() == absl::StatusCode::kAborted ||
                  sync.status().code() == absl::StatusCode::kFailedPrecondition)
          << sync.status();
      aborted += sync.status().code() == absl::StatusCode::kAborted;
      continue;
    }
    ++started;
    {
      // No definition commits while the sync is in flight.
      absl::MutexLock lock(&define_mu);
      EXPECT_EQ(sync->plan_key(), defined_key) << "sync " << sync->sync_id();
    }
    ASSERT_TRUE(controller_->syncs().Cancel(sync->sync_id(), "test").ok());
  }
  stop.store(true);
  redefine.join();
  EXPECT_GT(started, 0);
  std::cerr << started << " syncs started, " << aborted << " refused as redefined\n";
}

// Tick may finish a sync and prune its record (the oldest, past 256) in one
// call while WaitSync sleeps on it: the waiter still gets its final status.
TEST_F(SyncCoordinatorTest, AWaiterGetsTheFinalStatusOfASyncPrunedWhileItWaits) {
  config_.failure_grace = absl::ZeroDuration();  // ends at the deadline's first tick
  Restart();
  Register("a", "src", 0, 2, 16);
  Register("b", "src", 1, 2, 16);
  Register("c", "dst", 0, 1, 32);
  DefineSimple();
  v1::DefineTransferRequest other = controller_testing::SimpleTransfer();
  other.set_name("u");
  ASSERT_TRUE(controller_->syncs().DefineTransfer(other).ok());
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  req.set_deadline_ms(300);
  auto oldest = controller_->syncs().StartSync(req);
  ASSERT_TRUE(oldest.ok()) << oldest.status();
  for (int i = 0; i < 256; ++i) {
    v1::SyncRequest u;
    u.set_transfer("u");
    u.set_version(1);
    auto s = controller_->syncs().StartSync(u);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(controller_->syncs().Cancel(s->sync_id(), "filler").ok());
  }
  absl::StatusOr<v1::SyncStatus> waited;
  std::thread waiter(
      [&] { waited = controller_->syncs().WaitSync(oldest->sync_id(), absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(400));  // past its deadline, the waiter asleep
  controller_->syncs().Tick();
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(waited->error_code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_NE(waited->error().find("deadline"), std::string::npos) << waited->error();
  EXPECT_EQ(controller_->syncs().WaitSync(oldest->sync_id(), absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound)
      << "pruned";
}

// The WaitSync / WatchSync handlers loop on NextSyncUpdate: after Shutdown it
// must end their loop rather than return at once with the sync running.
TEST_F(SyncCoordinatorTest, NextSyncUpdateIsUnavailableOnceShutDown) {
  Register("a", "src", 0, 2, 16);
  Register("b", "src", 1, 2, 16);
  Register("c", "dst", 0, 1, 32);
  DefineSimple();
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  int64_t seen = -1;
  auto running = controller_->syncs().NextSyncUpdate(started->sync_id(), &seen, absl::Seconds(1));
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(running->phase(), v1::SYNC_RUNNING);
  controller_->syncs().Shutdown();
  const absl::Time before = absl::Now();
  auto after = controller_->syncs().NextSyncUpdate(started->sync_id(), &seen, absl::Seconds(5));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
  EXPECT_NE(after.status().message().find("shutting down"), std::string::npos) << after.status();
  EXPECT_LT(absl::Now() - before, absl::Seconds(1));
}

}  // namespace
}  // namespace wsync::controller
