// The first sync after a definition against the steady ones, with the
// warm-up on and off (docs/warm-up.md), in one run: real controller and
// worker processes on loopback, owners with shared-memory tensors in this
// process, a catalog case moved over Gloo. Each trial defines transfer
// "bench" again (a new transport generation) alternately with and without a
// warm-up, waits for the warm-up to end (the trainer's first training step
// hides it), then syncs one first and --steady later versions. Every version
// is verified on every destination rank.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catalog/case.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "controller/plan/compiled_layout.h"
#include "tools/demo/cluster.h"
#include "tools/demo/layout_data.h"
#include "tools/demo/owner.h"
#include "tools/demo/sync_steps.h"

ABSL_FLAG(std::string, model, "tiny-llama", "Catalog model.");
ABSL_FLAG(std::string, source, "fsdp:2", "Trainer layout.");
ABSL_FLAG(std::string, destination, "vllm-tp:2", "Inference layout.");
ABSL_FLAG(int32_t, trials, 5, "Definitions per mode (warm-up on, off), alternating.");
ABSL_FLAG(int32_t, steady, 5, "Syncs after the first one, per definition.");
ABSL_FLAG(std::string, controller_bin, WSYNC_CONTROLLER_BIN, "wsync-controller binary.");
ABSL_FLAG(std::string, worker_bin, WSYNC_WORKER_BIN, "wsync-worker binary.");
ABSL_FLAG(std::string, work_dir, "/tmp", "Folder for the cluster's files.");

namespace {

using wsync::demo::CallWithDeadline;

struct Run {
  wsync::v1::TransferSpec spec;
  std::optional<wsync::plan::CompiledSide> src, dst;
  std::vector<std::vector<wsync::demo::BufferSpec>> src_buffers, dst_buffers;
  std::unique_ptr<wsync::demo::Cluster> cluster;
  std::vector<std::unique_ptr<wsync::demo::OwnerRank>> src_owner, dst_owner;
};

absl::Status Start(Run& run) {
  wsync::catalog::CaseOptions co;
  co.model = absl::GetFlag(FLAGS_model);
  auto src = wsync::catalog::ParseSource(absl::GetFlag(FLAGS_source));
  auto dst = wsync::catalog::ParseDestination(absl::GetFlag(FLAGS_destination));
  if (!src.ok()) return src.status();
  if (!dst.ok()) return dst.status();
  co.source = *src;
  co.destination = *dst;
  ASSIGN_OR_RETURN(run.spec, wsync::catalog::BuildCase(co));
  ASSIGN_OR_RETURN(run.src,
                   wsync::plan::CompileSide(run.spec.source(), wsync::plan::SideRole::kSource));
  ASSIGN_OR_RETURN(run.dst, wsync::plan::CompileSide(run.spec.destination(),
                                                     wsync::plan::SideRole::kDestination));
  run.src_buffers = wsync::demo::BuffersPerRank(*run.src);
  run.dst_buffers = wsync::demo::BuffersPerRank(*run.dst);
  wsync::demo::ClusterOptions opt;
  opt.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  opt.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  opt.work_dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/wsync-first-sync-", getpid());
  opt.lease_ttl = absl::Seconds(10);
  ASSIGN_OR_RETURN(run.cluster, wsync::demo::Cluster::Start(opt));
  const int ns = static_cast<int>(run.src->workers.size());
  const int nd = static_cast<int>(run.dst->workers.size());
  const std::string shm = absl::StrCat("/wsync-first-sync-", getpid());
  for (int side = 0; side < 2; ++side) {
    const int n = side == 0 ? ns : nd;
    for (int r = 0; r < n; ++r) {
      const std::string group = side == 0 ? "trainer" : "inference";
      ASSIGN_OR_RETURN(int w, run.cluster->AddWorker({absl::StrCat(group, ":", r, ":", n)}));
      ASSIGN_OR_RETURN(auto owner, wsync::demo::OwnerRank::Create(
                                       run.cluster->worker(w).socket, group,
                                       side == 0 ? run.src_buffers[r] : run.dst_buffers[r],
                                       absl::StrCat(shm, side == 0 ? "-t" : "-i", r)));
      RETURN_IF_ERROR(owner->Register());
      (side == 0 ? run.src_owner : run.dst_owner).push_back(std::move(owner));
    }
  }
  return run.cluster->WaitForWorkers(ns + nd, absl::Seconds(60));
}

// Defines "bench" (again) and, with the warm-up on, waits until it ended.
absl::StatusOr<double> Define(Run& run, bool warm_up) {
  wsync::v1::DefineTransferRequest def;
  def.set_name("bench");
  def.set_source_group("trainer");
  def.set_destination_group("inference");
  *def.mutable_spec() = run.spec;
  def.set_no_warm_up(!warm_up);
  wsync::v1::DefineTransferResponse defined;
  grpc::Status s = CallWithDeadline([&](grpc::ClientContext* c) {
    return run.cluster->trainer().DefineTransfer(c, def, &defined);
  });
  if (!s.ok()) return absl::InternalError(absl::StrCat("DefineTransfer: ", s.error_message()));
  if (!warm_up) return 0.0;
  if (defined.warm_up_id().empty()) return absl::InternalError("no warm-up started");
  static const std::atomic<bool> kNoStop{false};
  ASSIGN_OR_RETURN(wsync::v1::WarmUpStatus w,
                   wsync::demo::AwaitWarmUp(*run.cluster, "bench", absl::Seconds(60), kNoStop));
  if (w.state() != wsync::v1::WARM_UP_WARM) {
    return absl::InternalError(absl::StrCat(
        "warm-up ", w.id(), " ended ", wsync::v1::WarmUpState_Name(w.state()), ": ", w.reason()));
  }
  return w.seconds();
}

struct Timed {
  double wall_ms = 0;  // Sync with wait_ms, as the trainer sees it
  double setup_ms = 0;
  double bind_ms = 0;
  double execute_ms = 0;  // the slowest worker's rounds (and direct writes)
};

absl::StatusOr<Timed> SyncVerified(Run& run, int v) {
  for (size_t r = 0; r < run.src_owner.size(); ++r) {
    RETURN_IF_ERROR(wsync::demo::FillSource(*run.src, r, v, run.src_owner[r]->memory()));
  }
  for (size_t r = 0; r < run.dst_owner.size(); ++r) {
    wsync::demo::Poison(run.dst_buffers[r], run.dst_owner[r]->memory());
  }
  wsync::v1::SyncRequest req;
  req.set_transfer("bench");
  req.set_version(v);
  req.set_wait_ms(60'000);
  wsync::v1::SyncResponse resp;
  const absl::Time t0 = absl::Now();
  grpc::Status s = CallWithDeadline(
      [&](grpc::ClientContext* c) { return run.cluster->trainer().Sync(c, req, &resp); });
  Timed t;
  t.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  if (!s.ok() || resp.status().phase() != wsync::v1::SYNC_SUCCEEDED) {
    return absl::InternalError(
        absl::StrCat("sync v", v, ": ", s.error_message(), resp.status().error()));
  }
  t.setup_ms = resp.status().max_setup_seconds() * 1e3;
  t.bind_ms = resp.status().max_bind_seconds() * 1e3;
  t.execute_ms = resp.status().max_execute_seconds() * 1e3;
  for (size_t r = 0; r < run.dst_owner.size(); ++r) {
    ASSIGN_OR_RETURN(auto res, wsync::demo::VerifyDestination(run.spec, *run.dst, *run.src, r, v,
                                                              run.dst_owner[r]->memory()));
    if (res.wrong_elements != 0) {
      return absl::DataLossError(absl::StrCat("v", v, ": ", res.first_error));
    }
  }
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Mode {
  std::vector<double> warm_up_ms, first_ms, first_setup_ms, first_bind_ms, first_execute_ms;
  std::vector<double> steady_ms, steady_execute_ms;
};

void Print(const char* name, const Mode& m) {
  std::printf(
      "%-12s first sync p50 %7.2f ms (setup %6.2f, bind %5.2f, execute %6.2f) | steady p50 "
      "%7.2f ms (execute %6.2f) | first / steady %.2f x",
      name, Median(m.first_ms), Median(m.first_setup_ms), Median(m.first_bind_ms),
      Median(m.first_execute_ms), Median(m.steady_ms), Median(m.steady_execute_ms),
      Median(m.first_ms) / Median(m.steady_ms));
  if (!m.warm_up_ms.empty()) std::printf(" | warm-up p50 %.2f ms", Median(m.warm_up_ms));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  wsync::InitLogging("first_sync_bench");
  absl::ParseCommandLine(argc, argv);
  Run run;
  absl::Status s = Start(run);
  Mode modes[2];  // [0] warm-up on, [1] off
  int v = 0;
  for (int trial = 0; s.ok() && trial < absl::GetFlag(FLAGS_trials); ++trial) {
    for (int m = 0; s.ok() && m < 2; ++m) {
      auto warm = Define(run, /*warm_up=*/m == 0);
      if (!warm.ok()) {
        s = warm.status();
        break;
      }
      if (m == 0) modes[m].warm_up_ms.push_back(*warm * 1e3);
      for (int k = 0; s.ok() && k <= absl::GetFlag(FLAGS_steady); ++k) {
        auto t = SyncVerified(run, ++v);
        if (!t.ok()) {
          s = t.status();
          break;
        }
        if (k == 0) {
          modes[m].first_ms.push_back(t->wall_ms);
          modes[m].first_setup_ms.push_back(t->setup_ms);
          modes[m].first_bind_ms.push_back(t->bind_ms);
          modes[m].first_execute_ms.push_back(t->execute_ms);
        } else {
          modes[m].steady_ms.push_back(t->wall_ms);
          modes[m].steady_execute_ms.push_back(t->execute_ms);
        }
      }
    }
  }
  if (run.cluster != nullptr) run.cluster->StopAll();
  if (!s.ok()) {
    spdlog::error("{}", s.ToString());
    return 1;
  }
  std::printf("%s %s -> %s, %d trials x (1 first + %d steady) per mode, every byte verified\n",
              absl::GetFlag(FLAGS_model).c_str(), absl::GetFlag(FLAGS_source).c_str(),
              absl::GetFlag(FLAGS_destination).c_str(), absl::GetFlag(FLAGS_trials),
              absl::GetFlag(FLAGS_steady));
  Print("warm-up on", modes[0]);
  Print("warm-up off", modes[1]);
  return 0;
}
