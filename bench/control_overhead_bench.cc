// Control overhead of a sync: an empty payload (a zero-element tensor, so no
// data plane) across N worker processes on loopback. Measures trigger (Sync
// RPC) -> every worker reported -> WaitSync returns, as the trainer sees it.
// Target: p50 <= 10 ms at 64 workers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "tools/demo/cluster.h"

ABSL_FLAG(int32_t, workers, 64, "Worker processes (half trainer, half inference).");
ABSL_FLAG(int32_t, syncs, 200, "Measured syncs.");
ABSL_FLAG(int32_t, warmup, 10, "Unmeasured syncs first.");
ABSL_FLAG(std::string, controller_bin, WSYNC_CONTROLLER_BIN, "wsync-controller binary.");
ABSL_FLAG(std::string, worker_bin, WSYNC_WORKER_BIN, "wsync-worker binary.");

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_workers);
  const int half = n / 2;
  wsync::demo::ClusterOptions opt;
  opt.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  opt.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  opt.work_dir = absl::StrCat("/tmp/wsync-bench-", getpid());
  opt.lease_ttl = absl::Seconds(20);
  opt.worker_flags = {"--metrics_port=-1"};
  auto cluster_or = wsync::demo::Cluster::Start(opt);
  if (!cluster_or.ok()) {
    std::fprintf(stderr, "%s\n", cluster_or.status().ToString().c_str());
    return 1;
  }
  auto& cluster = **cluster_or;
  for (int r = 0; r < half; ++r) {
    if (!cluster.AddWorker({absl::StrCat("trainer:", r, ":", half)}).ok()) return 1;
  }
  for (int r = 0; r < n - half; ++r) {
    if (!cluster.AddWorker({absl::StrCat("inference:", r, ":", n - half)}).ok()) return 1;
  }
  absl::Status ready = cluster.WaitForWorkers(n, absl::Seconds(120));
  if (!ready.ok()) {
    std::fprintf(stderr, "%s\n", ready.ToString().c_str());
    return 1;
  }
  wsync::v1::DefineTransferRequest def;
  def.set_name("bench");
  def.set_source_group("trainer");
  def.set_destination_group("inference");
  const int64_t elements = 0;  // empty payload: no data plane, pure control
  *def.mutable_spec()->mutable_source()->add_tensors() = Tensor(half, true, elements);
  *def.mutable_spec()->mutable_destination()->add_tensors() = Tensor(n - half, false, elements);
  wsync::v1::DefineTransferResponse defined;
  {
    grpc::ClientContext ctx;
    grpc::Status s = cluster.trainer().DefineTransfer(&ctx, def, &defined);
    if (!s.ok()) {
      std::fprintf(stderr, "DefineTransfer: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  std::printf("%d workers, %lld destination bytes, %lld buckets\n", defined.num_workers(),
              static_cast<long long>(defined.summary().destination_bytes()),
              static_cast<long long>(defined.summary().num_buckets()));
  std::vector<double> client_ms, controller_ms;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int total = warmup + absl::GetFlag(FLAGS_syncs);
  for (int v = 1; v <= total; ++v) {
    const absl::Time t0 = absl::Now();
    wsync::v1::SyncRequest req;
    req.set_transfer("bench");
    req.set_version(v);
    wsync::v1::SyncResponse resp;
    grpc::ClientContext c1;
    grpc::Status s = cluster.trainer().Sync(&c1, req, &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "Sync v%d: %s\n", v, s.error_message().c_str());
      return 1;
    }
    wsync::v1::WaitSyncRequest w;
    w.set_sync_id(resp.sync_id());
    wsync::v1::SyncStatus st;
    grpc::ClientContext c2;
    s = cluster.trainer().WaitSync(&c2, w, &st);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (!s.ok() || st.phase() != wsync::v1::SYNC_SUCCEEDED) {
      std::fprintf(stderr, "sync v%d: %s %s\n", v, s.error_message().c_str(), st.error().c_str());
      return 1;
    }
    if (v > warmup) {
      client_ms.push_back(ms);
      controller_ms.push_back(st.elapsed_seconds() * 1e3);
    }
  }
  auto pct = [](std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  };
  std::printf(
      "trigger -> all %d workers reported -> WaitSync returned (ms): p50 %.2f  p90 %.2f  "
      "p99 %.2f  max %.2f\n",
      n, pct(client_ms, 0.5), pct(client_ms, 0.9), pct(client_ms, 0.99), pct(client_ms, 1.0));
  std::printf("controller-side trigger -> last report (ms): p50 %.2f  p90 %.2f  p99 %.2f\n",
              pct(controller_ms, 0.5), pct(controller_ms, 0.9), pct(controller_ms, 0.99));
  cluster.StopAll();
  return 0;
}
