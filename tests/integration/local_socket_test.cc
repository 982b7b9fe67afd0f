// The worker's local socket (issue 18, item 2): mode 0600 in a private
// directory, refused in a world-writable one, and a second local process
// cannot replace the owner's destination buffer.
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/integration/harness.h"

namespace wsync::integration {
namespace {

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Waits for `child` to exit (at most `timeout`); its exit code, -1 if it did not.
int ExitCode(demo::Child& child, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (child.running()) {
    if (absl::Now() > until) return -1;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return WIFEXITED(child.exit_status()) ? WEXITSTATUS(child.exit_status()) : -1;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(LocalSocketIntegration, ASecondLocalClientCannotReplaceTheDestinationBuffer) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  const std::string socket = run.cluster->worker(run.dst_worker[0]).socket;
  EXPECT_EQ(ModeOf(socket), 0600);
  EXPECT_EQ(ModeOf(socket + ".fds"), 0600);
  const demo::BufferSpec& victim = run.dst_buffers[0][0];
  const std::string log = socket + ".attacker.log";
  auto attacker = demo::Child::Spawn(
      {WSYNC_LOCAL_CLIENT_BIN, socket, "inference", victim.name,
       std::to_string(static_cast<int>(victim.dtype)), std::to_string(victim.bytes)},
      log);
  ASSERT_TRUE(attacker.ok()) << attacker.status();
  EXPECT_EQ(ExitCode(*attacker, absl::Seconds(30)),
            static_cast<int>(grpc::StatusCode::PERMISSION_DENIED))
      << Slurp(log);
  EXPECT_NE(Slurp(log).find("still running"), std::string::npos) << Slurp(log);
  // The owner's buffers are still the ones written.
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(1);
  v1::SyncStatus status;
  ASSERT_TRUE(run.SyncAndWait("t", 1, &status).ok());
  EXPECT_EQ(status.phase(), v1::SYNC_SUCCEEDED) << status.error();
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;
}

TEST(LocalSocketIntegration, ASocketInAWorldWritableDirectoryIsRefused) {
  const demo::ClusterOptions options = DefaultClusterOptions();
  const std::string open_dir = options.work_dir + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  const std::string log = options.work_dir + "/open-worker.log";
  auto worker = demo::Child::Spawn(
      {WSYNC_WORKER_BIN, "--controller=127.0.0.1:1", "--insecure", "--groups=g:0:1",
       "--local_socket=" + open_dir + "/w.sock", "--metrics_port=-1"},
      log);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(ExitCode(*worker, absl::Seconds(30)), 2) << Slurp(log);
  EXPECT_NE(Slurp(log).find("mode 0777"), std::string::npos) << Slurp(log);
  EXPECT_NE(access((open_dir + "/w.sock").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace wsync::integration
