// Control overhead of a sync: an empty payload (a zero-element tensor, so no
// data plane) across N worker processes on loopback. Measures trigger (Sync
// RPC) -> every worker reported -> WaitSync returns, as the trainer sees it.
// Target: p50 <= 10 ms at 64 workers.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "tools/demo/cluster.h"
#include "tools/demo/process.h"

ABSL_FLAG(int32_t, workers, 64, "Worker processes (half trainer, half inference).");
ABSL_FLAG(int32_t, syncs, 200, "Measured syncs.");
ABSL_FLAG(int32_t, warmup, 10, "Unmeasured syncs first.");
ABSL_FLAG(std::string, controller_bin, WSYNC_CONTROLLER_BIN, "wsync-controller binary.");
ABSL_FLAG(std::string, worker_bin, WSYNC_WORKER_BIN, "wsync-worker binary.");
ABSL_FLAG(std::string, work_dir, "/tmp",
          "Folder for the cluster's files (the controller's --state_file among them: its "
          "file system's fsync latency is part of every sync).");
ABSL_FLAG(int32_t, pause_ms, 0,
          "Idle time before each sync (an RL step between syncs leaves the control path "
          "idle; 0: back to back).");
ABSL_FLAG(bool, one_call, true,
          "Sync with wait_ms (one round trip, as the Python client does); false: Sync, then "
          "WaitSync.");

ABSL_FLAG(int64_t, busy_poll_ms, 0,
          "The low-latency mode: passed as --busy_poll_ms to the controller and the workers "
          "(-1: spin forever; 0: off; N: spin N ms after the last activity).");
ABSL_FLAG(bool, busy_wait, false,
          "The bench's trainer polls its Sync call's completion queue without sleeping (as the "
          "Python client's busy_wait does).");

ABSL_FLAG(bool, lane, false,
          "The control fast lane: the controller serves --lane_socket in the cluster's folder, "
          "the workers report there (--controller_lane) and the bench's trainer calls Sync on "
          "it (with --busy_wait it spins on the socket).");

namespace {

std::unique_ptr<wsync::LaneClient>& Lane() {
  static std::unique_ptr<wsync::LaneClient> lane;
  return lane;
}

// The controller's and the workers' CPU seconds so far (controller first).
std::vector<double> ClusterCpu(wsync::demo::Cluster& cluster) {
  std::vector<double> cpu = {wsync::demo::CpuSecondsOf(cluster.controller_pid())};
  for (int i = 0; i < cluster.num_workers(); ++i)
    cpu.push_back(wsync::demo::CpuSecondsOf(cluster.worker(i).child.pid()));
  return cpu;
}

// One Sync call; with --busy_wait the calling thread polls its completion
// queue without sleeping until the answer.
grpc::Status CallSync(wsync::demo::Cluster& cluster, grpc::ClientContext* ctx,
                      const wsync::v1::SyncRequest& req, wsync::v1::SyncResponse* resp) {
  if (Lane() != nullptr) {
    wsync::v1::LaneRequest lreq;
    *lreq.mutable_sync() = req;
    absl::StatusOr<wsync::v1::LaneResponse> got = Lane()->Call(
        std::move(lreq), absl::Now() + absl::Seconds(120), absl::GetFlag(FLAGS_busy_wait));
    if (!got.ok()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, got.status().ToString());
    if (got->code() != 0) {
      return grpc::Status(static_cast<grpc::StatusCode>(got->code()), got->message());
    }
    *resp = got->sync();
    return grpc::Status::OK;
  }
  if (!absl::GetFlag(FLAGS_busy_wait)) return cluster.trainer().Sync(ctx, req, resp);
  grpc::CompletionQueue cq;
  grpc::Status status;
  auto call = cluster.trainer().AsyncSync(ctx, req, &cq);
  call->Finish(resp, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  while (cq.AsyncNext(&tag, &ok, gpr_inf_past(GPR_CLOCK_MONOTONIC)) !=
         grpc::CompletionQueue::GOT_EVENT) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

wsync::v1::TensorLayout Tensor(int n, bool shard, int64_t elements) {
  wsync::v1::TensorLayout t;
  t.set_name("w");
  t.set_dtype(wsync::v1::BF16);
  t.add_shape(elements);
  auto* mesh = t.mutable_mesh();
  mesh->add_mesh_shape(n);
  for (int r = 0; r < n; ++r) mesh->add_ranks(r);
  if (shard) {
    mesh->add_placements()->mutable_shard()->set_dim(0);
  } else {
    mesh->add_placements()->mutable_replicate();
  }
  return t;
}

// Starts the controller and n workers (half trainer, half inference).
absl::StatusOr<std::unique_ptr<wsync::demo::Cluster>> StartCluster(int n) {
  const int half = n / 2;
  wsync::demo::ClusterOptions opt;
  opt.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  opt.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  opt.work_dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/wsync-bench-", getpid());
  opt.lease_ttl = absl::Seconds(20);
  opt.worker_flags = {"--metrics_port=-1"};
  if (const int64_t busy = absl::GetFlag(FLAGS_busy_poll_ms); busy != 0) {
    opt.worker_flags.push_back(absl::StrCat("--busy_poll_ms=", busy));
    opt.controller_flags.push_back(absl::StrCat("--busy_poll_ms=", busy));
  }
  const std::string lane = absl::StrCat(opt.work_dir, "/lane.sock");
  if (absl::GetFlag(FLAGS_lane)) {
    opt.worker_flags.push_back(absl::StrCat("--controller_lane=", lane));
    opt.controller_flags.push_back(absl::StrCat("--lane_socket=", lane));
  }
  auto cluster = wsync::demo::Cluster::Start(opt);
  if (!cluster.ok()) {
    return absl::Status(cluster.status().code(),
                        absl::StrCat("controller: ", cluster.status().message()));
  }
  for (int r = 0; r < half; ++r) {
    auto w = (*cluster)->AddWorker({absl::StrCat("trainer:", r, ":", half)});
    if (!w.ok()) return w.status();
  }
  for (int r = 0; r < n - half; ++r) {
    auto w = (*cluster)->AddWorker({absl::StrCat("inference:", r, ":", n - half)});
    if (!w.ok()) return w.status();
  }
  absl::Status ready = (*cluster)->WaitForWorkers(n, absl::Seconds(120));
  if (!ready.ok()) return ready;
  if (absl::GetFlag(FLAGS_lane)) {
    auto client = wsync::LaneClient::Connect(lane);
    if (!client.ok()) return client.status();
    Lane() = *std::move(client);
  }
  return cluster;
}

// Defines transfer "bench": one empty tensor, sharded over the trainers and
// replicated over the inference workers (no data plane, pure control).
absl::Status DefineEmptyTransfer(wsync::demo::Cluster& cluster, int n) {
  const int half = n / 2;
  wsync::v1::DefineTransferRequest def;
  def.set_name("bench");
  def.set_source_group("trainer");
  def.set_destination_group("inference");
  const int64_t elements = 0;
  *def.mutable_spec()->mutable_source()->add_tensors() = Tensor(half, true, elements);
  *def.mutable_spec()->mutable_destination()->add_tensors() = Tensor(n - half, false, elements);
  wsync::v1::DefineTransferResponse defined;
  grpc::ClientContext ctx;
  grpc::Status s = cluster.trainer().DefineTransfer(&ctx, def, &defined);
  if (!s.ok()) return absl::InternalError(absl::StrCat("DefineTransfer: ", s.error_message()));
  std::printf("%d workers, %lld destination bytes, %lld buckets\n", defined.num_workers(),
              static_cast<long long>(defined.summary().destination_bytes()),
              static_cast<long long>(defined.summary().num_buckets()));
  return absl::OkStatus();
}

// Syncs versions 1..total; after `warmup` of them, records each sync's
// trigger -> WaitSync time as the trainer sees it and as the controller
// measured it.
absl::Status TimeSyncs(wsync::demo::Cluster& cluster, int warmup, int total,
                       std::vector<double>* client_ms, std::vector<double>* controller_ms,
                       std::vector<std::vector<double>>* phases_ms) {
  for (int v = 1; v <= total; ++v) {
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_pause_ms)));
    const absl::Time t0 = absl::Now();
    wsync::v1::SyncRequest req;
    req.set_transfer("bench");
    req.set_version(v);
    if (absl::GetFlag(FLAGS_one_call)) req.set_wait_ms(60'000);
    wsync::v1::SyncResponse resp;
    grpc::ClientContext c1;
    grpc::Status s = CallSync(cluster, &c1, req, &resp);
    if (!s.ok()) return absl::InternalError(absl::StrCat("Sync v", v, ": ", s.error_message()));
    wsync::v1::SyncStatus st = resp.status();
    if (!absl::GetFlag(FLAGS_one_call)) {
      wsync::v1::WaitSyncRequest w;
      w.set_sync_id(resp.sync_id());
      grpc::ClientContext c2;
      s = cluster.trainer().WaitSync(&c2, w, &st);
    }
    const absl::Time t1 = absl::Now();
    const double ms = absl::ToDoubleMilliseconds(t1 - t0);
    if (!s.ok() || st.phase() != wsync::v1::SYNC_SUCCEEDED) {
      return absl::InternalError(
          absl::StrCat("sync v", v, ": ", s.error_message(), " ", st.error()));
    }
    if (v > warmup) {
      client_ms->push_back(ms);
      controller_ms->push_back(st.elapsed_seconds() * 1e3);
      // request: the call until the controller triggered the sync; answer:
      // the sync's end until the call returned (one host, one clock).
      const double request_s =
          absl::ToDoubleSeconds(absl::FromUnixMicros(st.started_unix_us()) - t0);
      const double answer_s =
          absl::ToDoubleSeconds(t1 - absl::FromUnixMicros(st.finished_unix_us()));
      const double phases[] = {request_s,
                               st.max_deliver_seconds(),
                               st.max_queue_seconds(),
                               st.max_bind_seconds(),
                               st.max_run_seconds(),
                               st.max_report_seconds(),
                               answer_s};
      phases_ms->resize(std::size(phases));
      for (size_t i = 0; i < std::size(phases); ++i) (*phases_ms)[i].push_back(phases[i] * 1e3);
    }
  }
  return absl::OkStatus();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  wsync::InitLogging("control_overhead_bench");
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_workers);
  auto cluster = StartCluster(n);
  if (!cluster.ok()) {
    spdlog::error("{}", cluster.status().ToString());
    return 1;
  }
  std::vector<double> client_ms, controller_ms;
  std::vector<std::vector<double>> phases_ms;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  absl::Status s = DefineEmptyTransfer(**cluster, n);
  std::vector<double> cpu_before = ClusterCpu(**cluster);
  const absl::Time t_before = absl::Now();
  if (s.ok()) {
    s = TimeSyncs(**cluster, warmup, warmup + absl::GetFlag(FLAGS_syncs), &client_ms,
                  &controller_ms, &phases_ms);
  }
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - t_before);
  std::vector<double> cpu_after = ClusterCpu(**cluster);
  if (!s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 1;
  }
  std::printf(
      "trigger -> all %d workers reported -> WaitSync returned (ms): p50 %.2f  p90 %.2f  "
      "p99 %.2f  max %.2f\n",
      n, Percentile(client_ms, 0.5), Percentile(client_ms, 0.9), Percentile(client_ms, 0.99),
      Percentile(client_ms, 1.0));
  std::printf("controller-side trigger -> last report (ms): p50 %.2f  p90 %.2f  p99 %.2f\n",
              Percentile(controller_ms, 0.5), Percentile(controller_ms, 0.9),
              Percentile(controller_ms, 0.99));
  const char* names[] = {"request", "deliver", "queue", "bind", "run", "report", "answer"};
  std::printf("phases, p50 (ms; the slowest worker's for deliver..report):");
  for (size_t i = 0; i < phases_ms.size() && i < std::size(names); ++i) {
    std::printf("  %s %.3f", names[i], Percentile(phases_ms[i], 0.5));
  }
  std::printf("\n");
  // The mode's price: CPU time over the timed syncs (and their pauses) per
  // wall second, 1.0 = one core busy all along.
  std::printf("cpu cores used (cpu s / wall s over %.1f s): controller %.2f  workers", wall_s,
              (cpu_after[0] - cpu_before[0]) / wall_s);
  for (size_t i = 1; i < cpu_after.size(); ++i) {
    std::printf(" %.2f", (cpu_after[i] - cpu_before[i]) / wall_s);
  }
  std::printf("\n");
  Lane().reset();
  (*cluster)->StopAll();
  return 0;
}
