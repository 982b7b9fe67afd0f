// The controller's and a worker's /metrics scraped over plain HTTP and
// checked with `promtool check metrics`; grpc.health.v1 answers SERVING.

#include <cstdio>
#include <fstream>

#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/integration/http_get.h"
#include "tools/demo/owner.h"

namespace wsync::integration {
namespace {

// promtool's exit status on `text`.
int Promtool(const std::string& text, std::string* output) {
  const std::string file = absl::StrCat(::testing::TempDir(), "/", UniqueName("metrics"), ".txt");
  std::ofstream(file) << text;
  FILE* p = popen(("/usr/bin/promtool check metrics < " + file + " 2>&1").c_str(), "r");
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) *output += buf;
  return pclose(p);
}

TEST(MetricsIntegration, ControllerAndWorkerMetricsPassPromtool) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  for (int v = 1; v <= 2; ++v) {
    run.Fill(v);
    v1::SyncStatus st;
    ASSERT_TRUE(run.SyncAndWait("t", v, &st).ok());
    ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  }
  // The inference owners serve version 2 (SetServing on their workers).
  for (int r = 0; r < 2; ++r) {
    v1::SetServingRequest req;
    req.set_group("inference");
    req.set_version(2);
    req.set_state(v1::SERVING_STATE_SERVING);
    req.set_replica("r0");
    req.set_replica_ranks(2);
    grpc::ClientContext ctx;
    v1::SetServingResponse resp;
    const grpc::Status s = demo::LocalStub(run.cluster->worker(run.dst_worker[r]).socket)
                               ->SetServing(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string serving_series =
      "wsync_replica_state{group=\"inference\",replica=\"r0\",state=\"serving\"} 1";
  std::string controller;
  for (int i = 0; i < 200 && controller.find(serving_series) == std::string::npos; ++i) {
    if (i > 0) absl::SleepFor(absl::Milliseconds(50));
    controller = HttpGet(run.cluster->controller_metrics_port(), "/metrics");
  }
  for (const char* needle :
       {"wsync_syncs_total{outcome=\"succeeded\",transfer=\"t\"} 2",
        "wsync_sync_duration_seconds_bucket{transfer=\"t\",le=\"7200\"} 2",
        "wsync_sync_phase_seconds_count{phase=\"bind\",transfer=\"t\"} 2",
        "wsync_sync_bytes{transfer=\"t\"} ", "wsync_sync_bytes_total{transfer=\"t\"} ",
        "wsync_sync_last_success_timestamp_seconds{transfer=\"t\"} ",
        "wsync_syncs_in_flight{transfer=\"t\"} 0", "wsync_worker_registrations_total 4",
        "wsync_worker_leases_lost_total 0",
        "wsync_build_info{build_type=", "wsync_workers_registered 4", "wsync_workers_alive 4",
        "wsync_plan_duration_seconds_count 1", "wsync_plan_cache_hits_total",
        "wsync_plan_cache_misses_total 1", "wsync_weight_version{transfer=\"t\"} 2",
        "wsync_replica_serving_version{group=\"inference\",replica=\"r0\"} 2",
        serving_series.c_str()}) {
    EXPECT_NE(controller.find(needle), std::string::npos) << needle << "\n" << controller;
  }
  std::string out;
  EXPECT_EQ(Promtool(controller, &out), 0) << out;
  const std::string worker =
      HttpGet(run.cluster->worker(run.src_worker[0]).metrics_port, "/metrics");
  const std::string inference =
      HttpGet(run.cluster->worker(run.dst_worker[1]).metrics_port, "/metrics");
  for (const char* needle :
       {"wsync_worker_serving_version{group=\"inference\"} 2",
        "wsync_worker_serving_state{group=\"inference\",state=\"serving\"} 1",
        "wsync_worker_serving_state{group=\"inference\",state=\"failed\"} 0"}) {
    EXPECT_NE(inference.find(needle), std::string::npos) << needle << "\n" << inference;
  }
  out.clear();
  EXPECT_EQ(Promtool(inference, &out), 0) << out;
  for (const char* needle :
       {"wsync_worker_bytes_sent_total", "wsync_worker_bytes_received_total",
        "wsync_worker_round_duration_seconds_bucket", "wsync_worker_sync_duration_seconds_count 2",
        "wsync_worker_staging_bytes", "wsync_worker_errors_total", "component=\"worker\"",
        "wsync_worker_slow_peer_mappings 0",
        "wsync_worker_direct_write_bytes_total{direction=\"in\"} 0",
        "wsync_worker_put_gates_total{outcome=\"issued\"}",
        "wsync_worker_put_gates_total{outcome=\"timed_out\"} 0"}) {
    EXPECT_NE(worker.find(needle), std::string::npos) << needle << "\n" << worker;
  }
  // Trainer and inference workers share this host's /dev/shm: the trainer
  // wrote the inference workers' buffers directly.
  const std::string out_series = "wsync_worker_direct_write_bytes_total{direction=\"out\"} ";
  const size_t at = worker.find(out_series);
  ASSERT_NE(at, std::string::npos) << worker;
  EXPECT_GT(std::stod(worker.substr(at + out_series.size())), 0) << worker;
  out.clear();
  EXPECT_EQ(Promtool(worker, &out), 0) << out;
}

TEST(MetricsIntegration, HealthServiceServes) {
  demo::ClusterOptions options = DefaultClusterOptions();
  auto cluster = demo::Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto channel =
      grpc::CreateChannel((*cluster)->controller_address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  // HealthCheckRequest{service: ""} is the empty message.
  grpc::Slice empty_slice("");
  grpc::ByteBuffer request(&empty_slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "HealthCheckResponse{status: SERVING}";
}

}  // namespace
}  // namespace wsync::integration
