// Failures with real processes: a worker killed in the middle of a sync, a
// worker that stops heartbeating, a controller restart.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "gtest/gtest.h"
#include "tests/integration/define_fill_sync.h"
#include "tests/integration/harness.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::integration {
namespace {

v1::LocalStatusResponse LocalStatus(demo::OwnerRank& owner) {
  v1::LocalStatusRequest req;
  v1::LocalStatusResponse resp;
  Call([&](grpc::ClientContext* c) { return owner.stub().Status(c, req, &resp); });
  return resp;
}

// Freezes worker `victim` and starts the sync of `version` (deadline 8 s),
// so that the sync is certainly in flight when the victim is killed: its
// peers then wait for it in the rendezvous or a round.
v1::SyncResponse StartWithFrozenWorker(CaseRun& run, int victim, int64_t version) {
  EXPECT_TRUE(Freeze(run.cluster->worker(victim).child.pid()));
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(version);
  req.set_deadline_ms(8000);
  v1::SyncResponse started;
  EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().Sync(c, req, &started);
              }).ok());
  absl::SleepFor(absl::Milliseconds(300));
  return started;
}

TEST(FailureIntegration, WorkerKilledMidSyncFailsNamingItThenRecovers) {
  demo::ClusterOptions options = DefaultClusterOptions();
  auto run_or = CaseRun::Start(Case("fsdp:4", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(1);
  const int victim = run.dst_worker[1];
  const v1::SyncResponse started = StartWithFrozenWorker(run, victim, 1);
  const absl::Time killed = absl::Now();
  run.cluster->KillWorker(victim);
  v1::SyncStatus st;
  ASSERT_TRUE(run.Wait(started.sync_id(), &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(8)) << "must fail within the sync deadline";
  EXPECT_EQ(st.failed_group(), "inference");
  EXPECT_EQ(st.failed_rank(), 1);
  EXPECT_NE(st.error().find("inference/1"), std::string::npos) << st.error();
  // The controller is up and the other workers aborted cleanly (each reports
  // one failed sync and stays registered).
  for (int r = 0; r < 4; ++r) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (LocalStatus(*run.src_owner[r]).syncs_failed() < 1 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    v1::LocalStatusResponse ls = LocalStatus(*run.src_owner[r]);
    EXPECT_EQ(ls.syncs_failed(), 1) << "trainer rank " << r;
    EXPECT_TRUE(ls.registered()) << "trainer rank " << r;
  }
  // The worker comes back, its owner registers again, the next version works.
  ASSERT_TRUE(run.cluster->RestartWorker(victim).ok());
  ASSERT_TRUE(run.dst_owner[1]->Register().ok());
  ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  run.Fill(2);
  grpc::Status s2 = run.SyncAndWait("t", 2, &st);
  ASSERT_TRUE(s2.ok()) << s2.error_message();
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(2, &first), 0) << first;
}

// With the transport of a generation already up (version 1 synced), a peer
// killed mid-sync makes the others' rounds fail at once while the
// controller's abort of the same sync arrives: the abort must not reach an
// executor that the failed run already tore down (it did: SIGSEGV in
// Executor::Abort in most runs). Several rounds of kill and restart.
TEST(FailureIntegration, PeerKilledDuringAnEstablishedTransportLeavesTheOthersAlive) {
  auto run_or = CaseRun::Start(Case("fsdp:4", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  v1::SyncStatus st;
  run.Fill(1);
  ASSERT_TRUE(run.SyncAndWait("t", 1, &st).ok());
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  const int victim = run.dst_worker[1];
  int64_t version = 2;
  for (int attempt = 0; attempt < 3; ++attempt, ++version) {
    run.Fill(version);
    const v1::SyncResponse started = StartWithFrozenWorker(run, victim, version);
    run.cluster->KillWorker(victim);
    ASSERT_TRUE(run.Wait(started.sync_id(), &st).ok());
    EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
    ASSERT_TRUE(run.cluster->RestartWorker(victim).ok());
    const absl::Status registered = run.dst_owner[1]->Register();
    ASSERT_TRUE(registered.ok()) << registered;
    // Every other worker is still there: none crashed on the abort.
    absl::Status all = run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20));
    ASSERT_TRUE(all.ok()) << "attempt " << attempt << ": " << all;
    grpc::Status s = run.SyncAndWait("t", version, &st);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
    std::string first;
    EXPECT_EQ(run.Verify(version, &first), 0) << first;
  }
}

TEST(FailureIntegration, SilentWorkerLeaseExpiresAndFailsSync) {
  demo::ClusterOptions options = DefaultClusterOptions();
  // Short, but not so short that a loaded 2-core CI box misses heartbeats.
  options.lease_ttl = absl::Milliseconds(1500);
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(1);
  const int frozen = run.src_worker[0];
  const pid_t pid = run.cluster->worker(frozen).child.pid();
  ASSERT_TRUE(Freeze(pid));
  v1::SyncStatus st;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(run.SyncAndWait("t", 1, &st, /*deadline_ms=*/15000).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "lease expiry, not the 15 s deadline";
  EXPECT_EQ(st.failed_group(), "trainer");
  EXPECT_EQ(st.failed_rank(), 0);
  EXPECT_NE(st.error().find("lease expired"), std::string::npos) << st.error();
  // Resumed, the worker notices, registers again and the next version works.
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  run.Fill(2);
  grpc::Status s2 = run.SyncAndWait("t", 2, &st);
  ASSERT_TRUE(s2.ok()) << s2.error_message();
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(2, &first), 0) << first;
}

TEST(FailureIntegration, WorkersReRegisterAfterControllerRestart) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  absl::Status synced = DefineFillSync(run, "t", 1);
  ASSERT_TRUE(synced.ok()) << synced;
  run.cluster->KillController();
  ASSERT_TRUE(run.cluster->StartController().ok());
  // Workers come back by themselves, with the buffers their owners registered.
  ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  synced = DefineFillSync(run, "t", 2);  // the new controller knows no transfer
  ASSERT_TRUE(synced.ok()) << synced;
  std::string first;
  EXPECT_EQ(run.Verify(2, &first), 0) << first;
}

// A work dir reused from an earlier run (pids wrap; demo and bench dirs are
// named by pid) holds the old controller's port file. The cluster must wait
// for the new controller's, not connect to the dead one's port (a CI run
// flaked with "only 0 of 4 workers registered" this way).
TEST(FailureIntegration, StalePortFileOfAnEarlierControllerIsIgnored) {
  demo::ClusterOptions options = DefaultClusterOptions();
  int dead_port = 0;
  {
    // A port that nothing listens on any more.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    dead_port = ntohs(addr.sin_port);
    close(fd);
  }
  std::ofstream(options.work_dir + "/controller.1.ports")
      << "grpc_port=" << dead_port << "\nmetrics_port=" << dead_port << "\n";
  auto run = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE((*run)->cluster->controller_port(), dead_port);
  v1::DefineTransferResponse defined;
  ASSERT_TRUE((*run)->Define("t", &defined).ok());
}

}  // namespace
}  // namespace wsync::integration
