// wsync-demo: a controller and two groups of worker processes on this
// machine (trainer ranks -> vLLM-style inference ranks, a catalog model),
// owner ranks with real shared-memory tensors (or, with --gpus N, device
// tensors registered by CUDA IPC and moved over NCCL), several syncs of rising
// versions with every destination byte verified. Exit status 0 only if every
// sync succeeded and every byte matched.
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "catalog/case.h"
#include "controller/plan/compiled_layout.h"
#include "common/env_flags.h"
#include "grpcpp/grpcpp.h"
#include "tools/demo/cluster.h"
#include "tools/demo/gpu_owner.h"
#include "tools/demo/layout_data.h"
#include "tools/demo/owner.h"

ABSL_FLAG(std::string, model, "tiny-llama", "Catalog model (see `wsyncctl catalog`).");
ABSL_FLAG(std::string, source, "fsdp:4", "Trainer layout: fsdp:N, hsdp:RxN, megatron:tpA,ppB,dpC.");
ABSL_FLAG(std::string, destination, "vllm-tp:2", "Inference layout: vllm-tp:T or vllm-tp:TxR.");
ABSL_FLAG(bool, colocated, false, "Inference rank i runs in trainer worker i (local copies).");
ABSL_FLAG(int32_t, versions, 4, "Number of syncs (versions 1..N).");
ABSL_FLAG(std::string, work_dir, "", "Logs and sockets (default /tmp/wsync-demo-<pid>).");
ABSL_FLAG(std::string, controller_bin, "", "wsync-controller binary (default: build tree).");
ABSL_FLAG(std::string, worker_bin, "", "wsync-worker binary (default: build tree).");
ABSL_FLAG(absl::Duration, sync_deadline, absl::Seconds(60), "Deadline of each sync.");
ABSL_FLAG(int32_t, gpus, 0,
          "0: tensors in host shared memory, moved over Gloo. N > 0: every worker runs the GPU "
          "data plane (--device) on its own GPU (trainer rank r on GPU r; inference rank r on "
          "GPU trainers + r, or with trainer rank r when colocated; NCCL needs one GPU per "
          "worker), owners register "
          "device tensors by CUDA IPC, transfers run over NCCL. Needs a CUDA build.");
ABSL_FLAG(int32_t, kill_in_version, 0,
          "If > 0: the sync of this version first runs with the last inference worker frozen, "
          "which is then killed mid-sync; that sync must fail naming it, the worker is "
          "restarted, its owners register again, and the version is synced again.");

namespace {

std::atomic<bool> g_stop{false};

std::string SelfDir() {
  char buf[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string path(buf, n > 0 ? n : 0);
  return path.substr(0, path.rfind('/'));
}

template <typename Fn>
grpc::Status Call(Fn fn) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return fn(&ctx);
}

// Polls WaitSync until sync `id` leaves RUNNING (or Ctrl-C); the last status
// is in *st.
grpc::Status WaitUntilDone(wsync::demo::Cluster& cluster, const std::string& id,
                           wsync::v1::SyncStatus* st) {
  grpc::Status gs;
  do {
    wsync::v1::WaitSyncRequest w;
    w.set_sync_id(id);
    w.set_timeout_ms(200);
    gs = Call([&](grpc::ClientContext* c) { return cluster.trainer().WaitSync(c, w, st); });
  } while (gs.ok() && st->phase() == wsync::v1::SYNC_RUNNING && !g_stop.load());
  return gs;
}

// Freezes worker `victim`, starts the sync of version `v`, kills the worker
// while its peers wait for it in the rendezvous or a round, and checks that
// the sync fails (naming it) within its deadline; then restarts the worker
// and has its owners register again.
absl::Status KillMidSync(wsync::demo::Cluster& cluster, int v, int victim,
                         const std::vector<int>& src_worker, const std::vector<int>& dst_worker,
                         std::vector<std::unique_ptr<wsync::demo::Owner>>& src_owner,
                         std::vector<std::unique_ptr<wsync::demo::Owner>>& dst_owner) {
  using namespace wsync;
  const std::string name = cluster.worker(victim).name;
  if (kill(cluster.worker(victim).child.pid(), SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat("SIGSTOP of ", name, " failed"));
  }
  v1::SyncRequest req;
  req.set_transfer("demo");
  req.set_version(v);
  req.set_deadline_ms(15000);
  v1::SyncResponse started;
  grpc::Status gs =
      Call([&](grpc::ClientContext* c) { return cluster.trainer().Sync(c, req, &started); });
  if (!gs.ok()) return absl::InternalError(absl::StrCat("Sync: ", gs.error_message()));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time killed = absl::Now();
  cluster.KillWorker(victim);
  v1::SyncStatus st;
  gs = WaitUntilDone(cluster, started.sync_id(), &st);
  if (!gs.ok() || st.phase() != v1::SYNC_FAILED) {
    return absl::InternalError(absl::StrCat(
        "the sync with ", name,
        " killed did not fail: ", gs.ok() ? v1::SyncPhase_Name(st.phase()) : gs.error_message()));
  }
  std::printf("v%d %s: %s killed mid-sync: failed after %.2f s as it must (%s/%d: %s)\n", v,
              started.sync_id().c_str(), name.c_str(), absl::ToDoubleSeconds(absl::Now() - killed),
              st.failed_group().c_str(), st.failed_rank(), st.error().c_str());
  RETURN_IF_ERROR(cluster.RestartWorker(victim));
  for (size_t r = 0; r < src_worker.size(); ++r) {
    if (src_worker[r] == victim) RETURN_IF_ERROR(src_owner[r]->Register());
  }
  for (size_t r = 0; r < dst_worker.size(); ++r) {
    if (dst_worker[r] == victim) RETURN_IF_ERROR(dst_owner[r]->Register());
  }
  RETURN_IF_ERROR(cluster.WaitForWorkers(cluster.num_workers(), absl::Seconds(30)));
  std::printf("v%d: %s restarted and registered again; syncing v%d again\n", v, name.c_str(), v);
  return absl::OkStatus();
}

int Run() {
  using namespace wsync;
  // 1. The transfer: a catalog case.
  catalog::CaseOptions co;
  co.model = absl::GetFlag(FLAGS_model);
  auto src = catalog::ParseSource(absl::GetFlag(FLAGS_source));
  auto dst = catalog::ParseDestination(absl::GetFlag(FLAGS_destination));
  if (!src.ok() || !dst.ok()) {
    std::fprintf(stderr, "demo: %s\n",
                 (!src.ok() ? src.status() : dst.status()).ToString().c_str());
    return 2;
  }
  co.source = *src;
  co.destination = *dst;
  co.colocated = absl::GetFlag(FLAGS_colocated);
  auto spec = catalog::BuildCase(co);
  if (!spec.ok()) {
    std::fprintf(stderr, "demo: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  auto src_side = plan::CompileSide(spec->source(), plan::SideRole::kSource);
  auto dst_side = plan::CompileSide(spec->destination(), plan::SideRole::kDestination);
  if (!src_side.ok() || !dst_side.ok()) {
    std::fprintf(stderr, "demo: %s\n",
                 (!src_side.ok() ? src_side.status() : dst_side.status()).ToString().c_str());
    return 2;
  }
  const int num_src = static_cast<int>(src_side->workers.size());
  const int num_dst = static_cast<int>(dst_side->workers.size());
  if (co.colocated && num_dst > num_src) {
    std::fprintf(stderr, "demo: --colocated needs no more inference than trainer ranks\n");
    return 2;
  }
  const int gpus = absl::GetFlag(FLAGS_gpus);
  if (gpus < 0 || (gpus > 0 && demo::VisibleGpus() < gpus)) {
    std::fprintf(stderr, "demo: --gpus %d, but this process sees %d GPU(s)\n", gpus,
                 demo::VisibleGpus());
    return 2;
  }
  // NCCL allows one rank of a communicator per GPU.
  const int workers_needed = co.colocated ? num_src : num_src + num_dst;
  if (gpus > 0 && workers_needed > gpus) {
    std::fprintf(stderr, "demo: %d workers need %d GPUs (one NCCL rank per GPU), --gpus is %d\n",
                 workers_needed, workers_needed, gpus);
    return 2;
  }
  auto device_flags = [&](int device) {
    return gpus > 0 ? std::vector<std::string>{absl::StrCat("--device=", device)}
                    : std::vector<std::string>{};
  };
  const auto src_buffers = demo::BuffersPerRank(*src_side);
  const auto dst_buffers = demo::BuffersPerRank(*dst_side);

  // 2. Processes.
  demo::ClusterOptions opt;
  const std::string dir = absl::GetFlag(FLAGS_work_dir).empty()
                              ? absl::StrCat("/tmp/wsync-demo-", getpid())
                              : absl::GetFlag(FLAGS_work_dir);
  opt.work_dir = dir;
  opt.controller_bin = absl::GetFlag(FLAGS_controller_bin).empty()
                           ? SelfDir() + "/../../controller/server/wsync-controller"
                           : absl::GetFlag(FLAGS_controller_bin);
  opt.worker_bin = absl::GetFlag(FLAGS_worker_bin).empty()
                       ? SelfDir() + "/../../worker/agent/wsync-worker"
                       : absl::GetFlag(FLAGS_worker_bin);
  opt.sync_deadline = absl::GetFlag(FLAGS_sync_deadline);
  opt.lease_ttl = absl::Seconds(3);
  auto cluster_or = demo::Cluster::Start(opt);
  if (!cluster_or.ok()) {
    std::fprintf(stderr, "demo: controller: %s\n", cluster_or.status().ToString().c_str());
    return 1;
  }
  demo::Cluster& cluster = **cluster_or;
  std::printf("controller on 127.0.0.1:%d (metrics :%d), logs in %s\n", cluster.controller_port(),
              cluster.controller_metrics_port(), dir.c_str());
  std::vector<int> src_worker(num_src), dst_worker(num_dst);
  for (int r = 0; r < num_src; ++r) {
    std::vector<std::string> groups = {absl::StrCat("trainer:", r, ":", num_src)};
    if (co.colocated && r < num_dst) groups.push_back(absl::StrCat("inference:", r, ":", num_dst));
    auto w = cluster.AddWorker(groups, device_flags(r));
    if (!w.ok()) {
      std::fprintf(stderr, "demo: worker: %s\n", w.status().ToString().c_str());
      return 1;
    }
    src_worker[r] = *w;
    if (co.colocated && r < num_dst) dst_worker[r] = *w;
  }
  if (!co.colocated) {
    for (int r = 0; r < num_dst; ++r) {
      auto w = cluster.AddWorker({absl::StrCat("inference:", r, ":", num_dst)},
                                 device_flags(num_src + r));
      if (!w.ok()) {
        std::fprintf(stderr, "demo: worker: %s\n", w.status().ToString().c_str());
        return 1;
      }
      dst_worker[r] = *w;
    }
  }
  // 3. Owners: one shm object (or one device allocation) per rank,
  // registered with its worker.
  std::vector<std::unique_ptr<demo::Owner>> src_owner(num_src), dst_owner(num_dst);
  int64_t total_dst_bytes = 0;
  for (int side = 0; side < 2; ++side) {
    const int n = side == 0 ? num_src : num_dst;
    for (int r = 0; r < n; ++r) {
      const std::string group = side == 0 ? "trainer" : "inference";
      auto& owner = side == 0 ? src_owner[r] : dst_owner[r];
      const std::string& socket = cluster.worker(side == 0 ? src_worker[r] : dst_worker[r]).socket;
      const auto& buffers = side == 0 ? src_buffers[r] : dst_buffers[r];
      absl::StatusOr<std::unique_ptr<demo::Owner>> o;
      if (gpus > 0) {
        const int device = side == 0 || co.colocated ? r : num_src + r;
        o = demo::CreateGpuOwner(socket, group, buffers, device);
      } else {
        auto shm = demo::OwnerRank::Create(
            socket, group, buffers, absl::StrCat("/wsync-demo-", getpid(), "-", group, "-", r));
        if (shm.ok()) {
          o = std::unique_ptr<demo::Owner>(*std::move(shm));
        } else {
          o = shm.status();
        }
      }
      if (!o.ok()) {
        std::fprintf(stderr, "demo: owner: %s\n", o.status().ToString().c_str());
        return 1;
      }
      owner = *std::move(o);
      absl::Status s = owner->Register();
      if (!s.ok()) {
        std::fprintf(stderr, "demo: %s\n", s.ToString().c_str());
        return 1;
      }
      if (side == 1) total_dst_bytes += owner->bytes();
    }
  }
  absl::Status ready = cluster.WaitForWorkers(cluster.num_workers(), absl::Seconds(30));
  if (!ready.ok()) {
    std::fprintf(stderr, "demo: %s\n", ready.ToString().c_str());
    return 1;
  }
  // An inference engine would pause/resume on these events.
  grpc::ClientContext events_ctx;
  std::atomic<int> events{0};
  std::thread watcher([&] {
    v1::SyncEventsRequest req;
    auto reader = dst_owner[0]->stub().SyncEvents(&events_ctx, req);
    v1::SyncEvent e;
    while (reader->Read(&e)) ++events;
    reader->Finish();
  });

  // 4. The transfer.
  v1::DefineTransferRequest def;
  def.set_name("demo");
  def.set_source_group("trainer");
  def.set_destination_group("inference");
  *def.mutable_spec() = *spec;
  v1::DefineTransferResponse defined;
  grpc::Status gs = Call(
      [&](grpc::ClientContext* c) { return cluster.trainer().DefineTransfer(c, def, &defined); });
  int failures = 0;
  if (!gs.ok()) {
    std::fprintf(stderr, "demo: DefineTransfer: %s\n", gs.error_message().c_str());
    failures = 1;
  } else {
    const auto& sm = defined.summary();
    std::printf(
        "%s %s -> %s%s: %d workers, %.2f MiB into destinations (%.2f MiB network, %.2f MiB "
        "local), %d rounds, %lld buckets, planned in %.1f ms\n",
        co.model.c_str(), absl::GetFlag(FLAGS_source).c_str(),
        absl::GetFlag(FLAGS_destination).c_str(), co.colocated ? " (colocated)" : "",
        defined.num_workers(), sm.destination_bytes() / 1048576.0, sm.network_bytes() / 1048576.0,
        sm.local_bytes() / 1048576.0, sm.num_rounds(), static_cast<long long>(sm.num_buckets()),
        sm.plan_seconds() * 1e3);
  }
  // 5. Syncs of rising versions, every destination byte checked.
  const int versions = absl::GetFlag(FLAGS_versions);
  for (int v = 1; v <= versions && failures == 0 && !g_stop.load(); ++v) {
    const absl::Time t_fill = absl::Now();
    absl::Status filled;
    for (int r = 0; r < num_src && filled.ok(); ++r) {
      filled = demo::FillSource(*src_side, r, v, src_owner[r]->memory());
    }
    if (!filled.ok()) {
      std::fprintf(stderr, "demo: fill: %s\n", filled.ToString().c_str());
      ++failures;
      break;
    }
    for (int r = 0; r < num_dst; ++r) demo::Poison(dst_buffers[r], dst_owner[r]->memory());
    for (auto* owners : {&src_owner, &dst_owner}) {
      for (auto& o : *owners) {
        if (filled.ok()) filled = o->Publish();
      }
    }
    if (!filled.ok()) {
      std::fprintf(stderr, "demo: %s\n", filled.ToString().c_str());
      ++failures;
      break;
    }
    if (v == absl::GetFlag(FLAGS_kill_in_version)) {
      absl::Status s = KillMidSync(cluster, v, dst_worker[num_dst - 1], src_worker, dst_worker,
                                   src_owner, dst_owner);
      for (int r = 0; r < num_dst && s.ok(); ++r) {
        demo::Poison(dst_buffers[r], dst_owner[r]->memory());
        s = dst_owner[r]->Publish();
      }
      if (!s.ok()) {
        std::fprintf(stderr, "demo: kill in v%d: %s\n", v, s.ToString().c_str());
        ++failures;
        break;
      }
    }
    const double fill_s = absl::ToDoubleSeconds(absl::Now() - t_fill);
    const absl::Time t0 = absl::Now();
    v1::SyncRequest sreq;
    sreq.set_transfer("demo");
    sreq.set_version(v);
    v1::SyncResponse sresp;
    gs = Call([&](grpc::ClientContext* c) { return cluster.trainer().Sync(c, sreq, &sresp); });
    if (!gs.ok()) {
      std::fprintf(stderr, "demo: Sync v%d: %s\n", v, gs.error_message().c_str());
      ++failures;
      break;
    }
    v1::SyncStatus st;
    gs = WaitUntilDone(cluster, sresp.sync_id(), &st);
    const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!gs.ok() || st.phase() != v1::SYNC_SUCCEEDED) {
      std::fprintf(stderr, "demo: sync v%d did not succeed: %s\n", v,
                   gs.ok() ? st.error().c_str() : gs.error_message().c_str());
      ++failures;
      break;
    }
    const absl::Time t_verify = absl::Now();
    int64_t checked = 0, wrong = 0;
    std::string first;
    for (int r = 0; r < num_dst; ++r) {
      absl::Status fetched = dst_owner[r]->Fetch();
      if (!fetched.ok()) {
        first = fetched.ToString();
        ++wrong;
        continue;
      }
      auto res = demo::VerifyDestination(*spec, *dst_side, *src_side, r, v, dst_owner[r]->memory());
      if (!res.ok()) {
        first = res.status().ToString();
        ++wrong;
        continue;
      }
      checked += res->bytes;
      wrong += res->wrong_elements;
      if (first.empty()) first = res->first_error;
    }
    const double verify_s = absl::ToDoubleSeconds(absl::Now() - t_verify);
    std::printf(
        "v%d %s: %.3f MiB in %.2f ms (%.1f MiB/s) | plan %.2f ms (cache %s), dispatch %.2f ms, "
        "transport setup %.2f ms, execute %.2f ms, controller elapsed %.2f ms, direct-write "
        "pairs %d | fill %.1f ms, verify %.1f ms: %lld bytes checked, %lld wrong\n",
        v, sresp.sync_id().c_str(), st.bytes_total() / 1048576.0, wall * 1e3,
        st.bytes_total() / 1048576.0 / wall, st.plan_seconds() * 1e3,
        sresp.plan_cache_hit() ? "hit" : "miss", st.dispatch_seconds() * 1e3,
        st.max_setup_seconds() * 1e3, st.max_execute_seconds() * 1e3, st.elapsed_seconds() * 1e3,
        st.direct_pairs(), fill_s * 1e3, verify_s * 1e3, static_cast<long long>(checked),
        static_cast<long long>(wrong));
    if (wrong != 0) {
      std::fprintf(stderr, "demo: WRONG BYTES in v%d: %s\n", v, first.c_str());
      ++failures;
    }
  }
  // 6. Versions only move forward.
  if (failures == 0 && !g_stop.load()) {
    v1::SyncRequest old;
    old.set_transfer("demo");
    old.set_version(versions);
    v1::SyncResponse ignored;
    gs = Call([&](grpc::ClientContext* c) { return cluster.trainer().Sync(c, old, &ignored); });
    std::printf("re-sync of v%d refused: %s (%s)\n", versions,
                gs.error_code() == grpc::StatusCode::FAILED_PRECONDITION ? "yes" : "NO",
                gs.error_message().c_str());
    if (gs.error_code() != grpc::StatusCode::FAILED_PRECONDITION) ++failures;
    v1::GetStatusRequest sr;
    v1::GetStatusResponse status;
    if (Call([&](grpc::ClientContext* c) {
          return cluster.trainer().GetStatus(c, sr, &status);
        }).ok()) {
      std::printf(
          "plan cache: %lld hits, %lld misses; %d workers alive; sync events seen by "
          "inference rank 0's owner: %d\n",
          static_cast<long long>(status.plan_cache_hits()),
          static_cast<long long>(status.plan_cache_misses()), status.workers_alive(),
          events.load());
    }
  }
  events_ctx.TryCancel();
  watcher.join();
  cluster.StopAll();
  if (g_stop.load()) {
    std::printf("interrupted; everything stopped\n");
    return 130;
  }
  std::printf("%s\n", failures == 0 ? "OK: every destination byte verified" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  wsync::ParseFlagsWithEnv(argc, argv,
                           "wsync-demo: controller + worker processes on this machine, several "
                           "verified syncs of a catalog model.",
                           "tools/demo/", {});
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Ctrl-C: stop between steps; children are stopped by the cluster's
  // destructor (SIGTERM, SIGKILL after 3 s). A second signal exits at once.
  std::thread([signals]() mutable {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "demo: signal %d, stopping\n", sig);
    g_stop.store(true);
    sigwait(&signals, &sig);
    _exit(130);
  }).detach();
  return Run();
}
