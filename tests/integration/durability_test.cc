// Durable versions with real processes (issue 18 item 4): a controller
// killed and restarted keeps its transfers and last delivered versions
// (--state_file), refuses older versions, still answers for finished syncs;
// a corrupt state file stops the start; workers refuse a version older than
// the one they hold even when the controller lost its state.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace wsync::integration {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

grpc::Status StartSync(CaseRun& run, int64_t version, bool resend, v1::SyncResponse* resp) {
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(version);
  req.set_resend(resend);
  return Call([&](grpc::ClientContext* c) { return run.cluster->trainer().Sync(c, req, resp); });
}

void ExpectDelivered(CaseRun& run, int64_t version, bool resend = false) {
  run.Fill(version);
  v1::SyncResponse started;
  grpc::Status s = StartSync(run, version, resend, &started);
  ASSERT_TRUE(s.ok()) << "version " << version << ": " << s.error_message();
  v1::SyncStatus st;
  ASSERT_TRUE(run.Wait(started.sync_id(), &st).ok());
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(version, &first), 0) << first;
}

// The attack of issue 18: v5 delivered, the controller restarted, then
// "Sync v1" SUCCEEDED and the destinations went back to v1.
TEST(DurabilityIntegration, ARestartedControllerKeepsTransfersAndNeverGoesBack) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(5);
  v1::SyncStatus st;
  v1::SyncResponse v5;
  ASSERT_TRUE(run.SyncAndWait("t", 5, &st, 0, &v5).ok());
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();

  run.cluster->KillController();
  ASSERT_TRUE(run.cluster->StartController().ok());
  ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  // The transfer is there without a new definition, at version 5.
  v1::GetStatusResponse status;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, v1::GetStatusRequest(), &status);
              }).ok());
  ASSERT_EQ(status.transfers_size(), 1);
  EXPECT_EQ(status.transfers(0).last_success_version(), 5);
  // The finished sync's outcome survived too.
  ASSERT_TRUE(run.Wait(v5.sync_id(), &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED);

  run.Fill(1);
  v1::SyncResponse refused;
  grpc::Status s = StartSync(run, 1, /*resend=*/false, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("last delivered version 5"), std::string::npos)
      << s.error_message();
  s = StartSync(run, 5, /*resend=*/false, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("resend"), std::string::npos) << s.error_message();
  ExpectDelivered(run, 5, /*resend=*/true);
  ExpectDelivered(run, 6);
}

// A sync in flight when the controller died: its id is answered with a
// clear "earlier controller instance", not a bare NOT_FOUND.
TEST(DurabilityIntegration, ASyncCutByARestartIsReportedAsUnknownAfterRestart) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  const pid_t frozen = run.cluster->worker(run.dst_worker[0]).child.pid();
  ASSERT_TRUE(Freeze(frozen));
  run.Fill(1);
  v1::SyncResponse cut;
  ASSERT_TRUE(StartSync(run, 1, false, &cut).ok());
  run.cluster->KillController();
  ASSERT_EQ(kill(frozen, SIGCONT), 0);
  ASSERT_TRUE(run.cluster->StartController().ok());
  v1::SyncStatus st;
  grpc::Status s = run.Wait(cut.sync_id(), &st);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("earlier controller instance"), std::string::npos)
      << s.error_message();
  ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  ExpectDelivered(run, 1);  // never delivered: may be sent now
}

// A controller that lost its state (no --state_file, a new volume) is told
// by the workers: they refuse a version older than the one they applied,
// naming themselves and both versions, and leave their memory untouched.
TEST(DurabilityIntegration, WorkersRefuseAVersionOlderThanTheyHold) {
  demo::ClusterOptions options = DefaultClusterOptions();
  const std::string state = options.work_dir + "/controller.state";
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  ExpectDelivered(run, 5);
  run.cluster->KillController();
  ASSERT_EQ(unlink(state.c_str()), 0);  // and the other of its two files
  ASSERT_EQ(unlink((state + ".alt").c_str()), 0);
  ASSERT_TRUE(run.cluster->StartController().ok());
  ASSERT_TRUE(run.cluster->WaitForWorkers(run.cluster->num_workers(), absl::Seconds(20)).ok());
  ASSERT_TRUE(run.Define("t").ok());
  // The sources now hold version 1, the destinations keep version 5.
  for (size_t r = 0; r < run.src_owner.size(); ++r) {
    ASSERT_TRUE(
        demo::FillSource(run.src, static_cast<int32_t>(r), 1, run.src_owner[r]->memory()).ok());
  }
  v1::SyncStatus st;
  ASSERT_TRUE(run.SyncAndWait("t", 1, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st.error_code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(st.error().find("carries version 1"), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("already applied version 5"), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("worker "), std::string::npos) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(5, &first), 0) << "the destinations went back: " << first;
}

TEST(DurabilityIntegration, ACorruptStateFileStopsTheStartUnlessToldToStartEmpty) {
  const demo::ClusterOptions options = DefaultClusterOptions();
  const std::string state = options.work_dir + "/corrupt.state";
  std::ofstream(state) << "wsync-controller-state format=1 bytes=3 crc32=00000000\nabc";
  const std::string ports = options.work_dir + "/c.ports";
  const std::vector<std::string> argv = {options.controller_bin, "--listen=127.0.0.1:0",
                                         "--insecure",           "--metrics_port=-1",
                                         "--port_file=" + ports, "--state_file=" + state};
  const std::string log = options.work_dir + "/corrupt.log";
  auto child = demo::Child::Spawn(argv, log);
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (child->running() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE(child->running()) << "started with a corrupt state file";
  EXPECT_NE(child->exit_status(), 0);
  const std::string text = Slurp(log);
  EXPECT_NE(text.find(state), std::string::npos) << text;
  EXPECT_NE(text.find("corrupt"), std::string::npos) << text;

  std::vector<std::string> empty = argv;
  empty.push_back("--state_start_empty");
  auto started = demo::Child::Spawn(empty, log);
  ASSERT_TRUE(started.ok()) << started.status();
  auto port = demo::ReadPortFile(ports, absl::Seconds(20), &*started);
  EXPECT_TRUE(port.ok()) << port.status() << Slurp(log);
  started->Stop(absl::Seconds(3));
}

}  // namespace
}  // namespace wsync::integration
