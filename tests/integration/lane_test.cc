// The control fast lane (--lane_socket of wsync-controller, --controller_lane
// of wsync-worker; controller/server/lane_server.h) with the real binaries:
// syncs whose trainer call and worker reports go over the lane, every byte
// checked; a malformed frame and a forged lease against the real controller;
// a trainer that leaves mid-sync and a worker killed mid-sync; workers whose
// lane is absent report over gRPC.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/define_fill_sync.h"
#include "tests/integration/harness.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A cluster whose controller serves the lane and whose workers report on it.
demo::ClusterOptions LaneCluster(std::string* lane) {
  demo::ClusterOptions o = DefaultClusterOptions();
  *lane = o.work_dir + "/lane.sock";
  o.controller_flags.push_back("--lane_socket=" + *lane);
  o.worker_flags.push_back("--controller_lane=" + *lane);
  return o;
}

v1::LaneRequest SyncRequest(int64_t version, int64_t wait_ms = 30'000) {
  v1::LaneRequest r;
  r.mutable_sync()->set_transfer("t");
  r.mutable_sync()->set_version(version);
  r.mutable_sync()->set_wait_ms(wait_ms);
  return r;
}

// Sync `version` over the lane with its wait; the answer.
v1::LaneResponse LaneSync(const std::string& lane, int64_t version) {
  auto c = LaneClient::Connect(lane);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return v1::LaneResponse();
  auto resp = (*c)->Call(SyncRequest(version), absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? *resp : v1::LaneResponse();
}

std::string WorkerLog(CaseRun& run, int index, const demo::ClusterOptions& o) {
  return Slurp(absl::StrCat(o.work_dir, "/", run.cluster->worker(index).name, ".log"));
}

TEST(LaneIntegration, SyncsGoOverTheLaneWithTheReportsAndEveryByteIsRight) {
  std::string lane;
  const demo::ClusterOptions o = LaneCluster(&lane);
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), o);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  for (int v = 1; v <= 3; ++v) {
    run.Fill(v);
    const v1::LaneResponse resp = LaneSync(lane, v);
    ASSERT_EQ(resp.code(), 0) << resp.message();
    ASSERT_EQ(resp.sync().status().phase(), v1::SYNC_SUCCEEDED) << resp.sync().status().error();
    EXPECT_EQ(resp.sync().status().version(), v);
    EXPECT_EQ(resp.sync().status().workers_done(), resp.sync().status().workers_total());
    std::string first;
    EXPECT_EQ(run.Verify(v, &first), 0) << "version " << v << ": " << first;
  }
  for (int i = 0; i < run.cluster->num_workers(); ++i) {
    const std::string log = WorkerLog(run, i, o);
    EXPECT_THAT(log, HasSubstr("reports over the control lane")) << log;
    EXPECT_THAT(log, HasSubstr("receives assignments over the control lane")) << log;
    EXPECT_THAT(log, Not(HasSubstr("over gRPC"))) << log;
    EXPECT_THAT(log, Not(HasSubstr("not delivered"))) << log;
  }
  // The same errors as over gRPC: an older version is refused.
  const v1::LaneResponse older = LaneSync(lane, 1);
  EXPECT_EQ(older.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(older.message(), HasSubstr("version"));

  // A forged lease: refused. A malformed frame: an error, then closed.
  auto c = LaneClient::Connect(lane);
  ASSERT_TRUE(c.ok());
  v1::LaneRequest hello;
  hello.mutable_hello()->set_lease_id("forged-lease");
  auto refused = (*c)->Call(hello, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->code(), static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, lane.data(), lane.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string junk = "GET / HTTP/1.1\r\n\r\n";  // not a lane peer
  ASSERT_EQ(send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_EQ(n, 0) << "closed by the controller";
  auto frame = NextLaneFrame(got, kLaneMaxFrameBytes);
  ASSERT_TRUE(frame.ok() && frame->consumed > 0) << got.size();
  v1::LaneResponse error;
  ASSERT_TRUE(ParseLanePayload(frame->payload, "LaneResponse", &error).ok());
  EXPECT_EQ(error.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(error.message(), HasSubstr("over the limit"));
  // And it goes on.
  run.Fill(4);
  const v1::LaneResponse after = LaneSync(lane, 4);
  EXPECT_EQ(after.sync().status().phase(), v1::SYNC_SUCCEEDED) << after.message();
}

TEST(LaneIntegration, ATrainerThatLeavesMidSyncAndAWorkerKilledMidSync) {
  std::string lane;
  demo::ClusterOptions o = LaneCluster(&lane);
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), o);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  // A frozen destination keeps the sync running while its trainer leaves.
  const int victim = run.dst_worker[0];
  const pid_t frozen = run.cluster->worker(victim).child.pid();
  run.Fill(1);
  ASSERT_TRUE(Freeze(frozen));
  {
    auto c = LaneClient::Connect(lane);
    ASSERT_TRUE(c.ok());
    auto id = (*c)->Send(SyncRequest(1), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(id.ok());
    auto none = (*c)->Receive(*id, absl::Now() + absl::Milliseconds(200), false);
    ASSERT_TRUE(none.ok());
    ASSERT_FALSE(none->has_value()) << "the sync cannot have ended";
  }                                     // gone, mid-sync
  ASSERT_EQ(kill(frozen, SIGCONT), 0);  // within the lease TTL
  // The sync ends all the same (the controller is not stuck on the gone peer).
  int64_t delivered = 0;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (delivered < 1 && absl::Now() < until) {
    v1::GetStatusResponse st;
    ASSERT_TRUE(Call([&](grpc::ClientContext* ctx) {
                  return run.cluster->trainer().GetStatus(ctx, v1::GetStatusRequest(), &st);
                }).ok());
    for (const auto& t : st.transfers()) delivered = t.last_success_version();
    if (delivered < 1) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(delivered, 1);
  auto c = LaneClient::Connect(lane);
  ASSERT_TRUE(c.ok());
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;

  // A worker killed mid-sync: the waiting trainer hears the failure on the lane.
  run.Fill(2);
  ASSERT_TRUE(Freeze(frozen));
  auto id = (*c)->Send(SyncRequest(2), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(id.ok());
  run.cluster->KillWorker(victim);
  auto failed = (*c)->Receive(*id, absl::Now() + absl::Seconds(60), false);
  ASSERT_TRUE(failed.ok() && failed->has_value()) << failed.status();
  EXPECT_EQ((*failed)->code(), 0) << (*failed)->message();
  EXPECT_EQ((*failed)->sync().status().phase(), v1::SYNC_FAILED);
  EXPECT_THAT((*failed)->sync().status().error(), HasSubstr("inference"));
}

TEST(LaneIntegration, WorkersReportOverGrpcWhenTheLaneIsAbsent) {
  demo::ClusterOptions o = DefaultClusterOptions();
  o.worker_flags.push_back("--controller_lane=" + o.work_dir + "/absent.sock");
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), o);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  const absl::Status synced = DefineFillSync(run, "t", 1);
  ASSERT_TRUE(synced.ok()) << synced;
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;
  for (int i = 0; i < run.cluster->num_workers(); ++i) {
    const std::string log = WorkerLog(run, i, o);
    EXPECT_THAT(log, HasSubstr("absent.sock")) << log;
    EXPECT_THAT(log, HasSubstr("reporting over gRPC")) << log;
    EXPECT_THAT(log, HasSubstr("reading them over gRPC")) << log;
    EXPECT_THAT(log, Not(HasSubstr("not delivered"))) << log;
  }
}

}  // namespace
}  // namespace wsync::integration
