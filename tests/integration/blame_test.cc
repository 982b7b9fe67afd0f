// Blame with real processes (issue 18 item 5): a sync that fails names the
// worker that stalled or died, not a healthy peer that reported first.
// Transfer fsdp:4 -> vllm-tp:2: trainer/0..3 are workers 0..3, inference/0
// and inference/1 workers 4 and 5.
#include <signal.h>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace wsync::integration {
namespace {

v1::SyncResponse Start(CaseRun& run, int64_t version, int64_t deadline_ms) {
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(version);
  req.set_deadline_ms(deadline_ms);
  v1::SyncResponse started;
  EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().Sync(c, req, &started);
              }).ok());
  return started;
}

// The version-1 sync that sets up the transport, so that version 2's
// peers are connected to the victim.
void DeliverFirstVersion(CaseRun& run) {
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(1);
  v1::SyncStatus st;
  ASSERT_TRUE(run.SyncAndWait("t", 1, &st).ok());
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
}

// Frozen (SIGSTOP) for the whole sync, its lease longer than the deadline:
// the others stop at the deadline waiting for it. The sync named trainer/0
// (the first worker not done) or inference/0 (the first deadline report).
TEST(BlameIntegration, AFrozenWorkerIsNamedWhenTheDeadlinePasses) {
  demo::ClusterOptions options = DefaultClusterOptions();
  options.lease_ttl = absl::Seconds(30);
  auto run_or = CaseRun::Start(Case("fsdp:4", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  DeliverFirstVersion(run);
  const pid_t victim = run.cluster->worker(run.dst_worker[1]).child.pid();
  ASSERT_TRUE(Freeze(victim));
  run.Fill(2);
  const absl::Time start = absl::Now();
  const v1::SyncResponse started = Start(run, 2, /*deadline_ms=*/3000);
  v1::SyncStatus st;
  ASSERT_TRUE(run.Wait(started.sync_id(), &st).ok());
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(kill(victim, SIGCONT), 0);
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st.error_code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(st.failed_group(), "inference") << st.error();
  EXPECT_EQ(st.failed_rank(), 1) << st.error();
  EXPECT_NE(st.error().find("did not report: worker inference/1"), std::string::npos) << st.error();
  EXPECT_EQ(st.error().find("trainer/0 ["), std::string::npos) << st.error();
  EXPECT_LT(took, absl::Seconds(3) + absl::Seconds(1) + absl::Seconds(2))
      << "deadline + --failure_grace + slack";
}

// Killed (SIGKILL) while its peers wait on it in a round over an
// established transport: they see the connection reset at once and report
// "recv from peer N" (some peer), its stream ends a moment later. The sync
// named the reporter ("trainer/0 failed: recv from peer 3").
TEST(BlameIntegration, AKilledWorkerIsNamedNotThePeerThatSawTheResetFirst) {
  auto run_or = CaseRun::Start(Case("fsdp:4", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  DeliverFirstVersion(run);
  int64_t version = 2;
  for (int attempt = 0; attempt < 2; ++attempt, ++version) {
    const int victim = run.dst_worker[1];
    ASSERT_TRUE(Freeze(run.cluster->worker(victim).child.pid()));
    run.Fill(version);
    const v1::SyncResponse started = Start(run, version, /*deadline_ms=*/15000);
    absl::SleepFor(absl::Milliseconds(500));  // the others block on it
    run.cluster->KillWorker(victim);
    v1::SyncStatus st;
    ASSERT_TRUE(run.Wait(started.sync_id(), &st).ok());
    EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
    EXPECT_EQ(st.failed_group(), "inference") << st.error();
    EXPECT_EQ(st.failed_rank(), 1) << st.error();
    EXPECT_NE(st.error().find("inference/1"), std::string::npos) << st.error();
    ASSERT_TRUE(run.cluster->RestartWorker(victim).ok());
    const absl::Status registered = run.dst_owner[1]->Register();
    ASSERT_TRUE(registered.ok()) << registered;
    ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  }
}

}  // namespace
}  // namespace wsync::integration
