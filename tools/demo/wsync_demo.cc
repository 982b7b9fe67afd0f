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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "catalog/case.h"
#include "common/env_flags.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "controller/plan/compiled_layout.h"
#include "grpcpp/grpcpp.h"
#include "tools/demo/cluster.h"
#include "tools/demo/gpu_owner.h"
#include "tools/demo/layout_data.h"
#include "tools/demo/owner.h"
#include "tools/demo/placement.h"
#include "tools/demo/sync_steps.h"

using wsync::demo::VersionFigures;

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
          "data plane (--device) on its own GPU, its --placement slot (by default trainer rank "
          "r on GPU r; inference rank r on GPU trainers + r, or with trainer rank r when "
          "colocated; NCCL needs one GPU per worker), owners register "
          "device tensors by CUDA IPC, transfers run over NCCL. Needs a CUDA build.");
ABSL_FLAG(bool, result_lines, false,
          "Also print each version's figures as one 'RESULT {...}' JSON line (for scripts, "
          "e.g. bench/gpu/run_two_nodes.sh).");
ABSL_FLAG(bool, warm_up, true,
          "Warm the workers up when the transfer is defined and wait for it before the first "
          "sync (docs/warm-up.md); false: DefineTransfer with no_warm_up.");
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

// A failed step; its message is printed as one plain "demo: <message>" line
// on stderr (scripts/gpu_run.sh collects the lines starting with "demo:",
// so they stay unformatted rather than going through the logger).
absl::Status Err(const std::string& text) { return absl::UnknownError(text); }

void PrintFailure(const absl::Status& s) {
  std::fprintf(stderr, "demo: %s\n", std::string(s.message()).c_str());
}

// fn(0) ... fn(n - 1), each on a thread of its own (ranks' host memory is
// filled and checked in parallel: a few hundred MB take seconds per rank).
void ForEachRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// One demo run: the catalog case, its processes and owners, and the syncs.
class Demo {
 public:
  // Step 1: the catalog case, compiled. Failures are usage errors (exit 2).
  absl::Status Prepare();
  // Steps 2-3: controller, workers, owners registered (exit 1 on failure).
  absl::Status Start();
  // Steps 4-6: defines the transfer, syncs every version, checks that
  // versions only move forward. Returns the number of failures.
  int SyncAll();
  // Stops everything; the process's exit code.
  int Finish(int failures);

 private:
  // wsync-worker flags of worker `w`: its GPU and node.
  std::vector<std::string> WorkerFlags(int w) const {
    std::vector<std::string> flags;
    if (gpus_ > 0) flags.push_back(absl::StrCat("--device=", placement_.slots[w]));
    if (!placement_.nodes[w].empty()) flags.push_back(absl::StrCat("--node=", placement_.nodes[w]));
    return flags;
  }
  absl::Status StartWorkers();
  absl::StatusOr<std::unique_ptr<wsync::demo::Owner>> MakeOwner(int side, int r);
  absl::Status StartOwners();
  void WatchEvents();
  absl::Status DefineTransfer();
  absl::Status PrepareVersion(int v);
  absl::Status SyncVersion(int v);
  absl::Status VerifyVersion(int v, const wsync::v1::SyncResponse& sresp,
                             const wsync::v1::SyncStatus& st, double wall, double fill_s);
  absl::Status CheckVersionsMoveForward();

  wsync::catalog::CaseOptions co_;
  wsync::v1::TransferSpec spec_;
  std::optional<wsync::plan::CompiledSide> src_side_, dst_side_;
  int num_src_ = 0, num_dst_ = 0, gpus_ = 0;
  wsync::demo::Placement placement_;
  std::vector<std::vector<wsync::demo::BufferSpec>> src_buffers_, dst_buffers_;
  std::string dir_;
  std::unique_ptr<wsync::demo::Cluster> cluster_;
  std::vector<int> src_worker_, dst_worker_;
  std::vector<std::unique_ptr<wsync::demo::Owner>> src_owner_, dst_owner_;
  grpc::ClientContext events_ctx_;
  std::atomic<int> events_{0};
  std::thread watcher_;
};

absl::Status Demo::Prepare() {
  using namespace wsync;
  co_.model = absl::GetFlag(FLAGS_model);
  auto src = catalog::ParseSource(absl::GetFlag(FLAGS_source));
  auto dst = catalog::ParseDestination(absl::GetFlag(FLAGS_destination));
  if (!src.ok() || !dst.ok()) return Err((!src.ok() ? src.status() : dst.status()).ToString());
  co_.source = *src;
  co_.destination = *dst;
  co_.colocated = absl::GetFlag(FLAGS_colocated);
  auto spec = catalog::BuildCase(co_);
  if (!spec.ok()) return Err(spec.status().ToString());
  spec_ = *std::move(spec);
  auto src_side = plan::CompileSide(spec_.source(), plan::SideRole::kSource);
  auto dst_side = plan::CompileSide(spec_.destination(), plan::SideRole::kDestination);
  if (!src_side.ok() || !dst_side.ok()) {
    return Err((!src_side.ok() ? src_side.status() : dst_side.status()).ToString());
  }
  src_side_ = *std::move(src_side);
  dst_side_ = *std::move(dst_side);
  num_src_ = static_cast<int>(src_side_->workers.size());
  num_dst_ = static_cast<int>(dst_side_->workers.size());
  if (co_.colocated && num_dst_ > num_src_) {
    return Err("--colocated needs no more inference than trainer ranks");
  }
  gpus_ = absl::GetFlag(FLAGS_gpus);
  if (gpus_ < 0 || (gpus_ > 0 && demo::VisibleGpus() < gpus_)) {
    return Err(
        absl::StrFormat("--gpus %d, but this process sees %d GPU(s)", gpus_, demo::VisibleGpus()));
  }
  // NCCL allows one rank of a communicator per GPU.
  const int workers_needed = co_.colocated ? num_src_ : num_src_ + num_dst_;
  if (gpus_ > 0 && workers_needed > gpus_) {
    return Err(absl::StrFormat("%d workers need %d GPUs (one NCCL rank per GPU), --gpus is %d",
                               workers_needed, workers_needed, gpus_));
  }
  auto placement = demo::PlaceWorkersFromFlags(workers_needed, gpus_, &spec_);
  if (!placement.ok()) return Err(placement.status().ToString());
  placement_ = *std::move(placement);
  src_buffers_ = demo::BuffersPerRank(*src_side_);
  dst_buffers_ = demo::BuffersPerRank(*dst_side_);
  return absl::OkStatus();
}

absl::Status Demo::Start() {
  wsync::demo::ClusterOptions opt;
  dir_ = absl::GetFlag(FLAGS_work_dir).empty() ? absl::StrCat("/tmp/wsync-demo-", getpid())
                                               : absl::GetFlag(FLAGS_work_dir);
  opt.work_dir = dir_;
  opt.controller_bin = absl::GetFlag(FLAGS_controller_bin).empty()
                           ? SelfDir() + "/../../controller/server/wsync-controller"
                           : absl::GetFlag(FLAGS_controller_bin);
  opt.worker_bin = absl::GetFlag(FLAGS_worker_bin).empty()
                       ? SelfDir() + "/../../worker/agent/wsync-worker"
                       : absl::GetFlag(FLAGS_worker_bin);
  opt.sync_deadline = absl::GetFlag(FLAGS_sync_deadline);
  opt.lease_ttl = absl::Seconds(3);
  auto cluster = wsync::demo::Cluster::Start(opt);
  if (!cluster.ok()) return Err(absl::StrCat("controller: ", cluster.status().ToString()));
  cluster_ = *std::move(cluster);
  std::printf("controller on 127.0.0.1:%d (metrics :%d), logs in %s\n", cluster_->controller_port(),
              cluster_->controller_metrics_port(), dir_.c_str());
  RETURN_IF_ERROR(StartWorkers());
  RETURN_IF_ERROR(StartOwners());
  absl::Status ready = cluster_->WaitForWorkers(cluster_->num_workers(), absl::Seconds(30));
  if (!ready.ok()) return Err(ready.ToString());
  WatchEvents();
  return absl::OkStatus();
}

// Trainer rank r on worker r (with inference rank r when colocated), else
// inference rank r on worker num_src + r.
absl::Status Demo::StartWorkers() {
  src_worker_.assign(num_src_, 0);
  dst_worker_.assign(num_dst_, 0);
  for (int r = 0; r < num_src_; ++r) {
    std::vector<std::string> groups = {absl::StrCat("trainer:", r, ":", num_src_)};
    if (co_.colocated && r < num_dst_) {
      groups.push_back(absl::StrCat("inference:", r, ":", num_dst_));
    }
    auto w = cluster_->AddWorker(groups, WorkerFlags(r));
    if (!w.ok()) return Err(absl::StrCat("worker: ", w.status().ToString()));
    src_worker_[r] = *w;
    if (co_.colocated && r < num_dst_) dst_worker_[r] = *w;
  }
  if (co_.colocated) return absl::OkStatus();
  for (int r = 0; r < num_dst_; ++r) {
    auto w = cluster_->AddWorker({absl::StrCat("inference:", r, ":", num_dst_)},
                                 WorkerFlags(num_src_ + r));
    if (!w.ok()) return Err(absl::StrCat("worker: ", w.status().ToString()));
    dst_worker_[r] = *w;
  }
  return absl::OkStatus();
}

// The owner of rank r of side `side` (0 trainer, 1 inference): one shm
// object, or one device allocation with --gpus.
absl::StatusOr<std::unique_ptr<wsync::demo::Owner>> Demo::MakeOwner(int side, int r) {
  const std::string group = side == 0 ? "trainer" : "inference";
  const std::string& socket = cluster_->worker(side == 0 ? src_worker_[r] : dst_worker_[r]).socket;
  const auto& buffers = side == 0 ? src_buffers_[r] : dst_buffers_[r];
  if (gpus_ > 0) {
    const int worker = side == 0 || co_.colocated ? r : num_src_ + r;
    return wsync::demo::CreateGpuOwner(socket, group, buffers, placement_.slots[worker]);
  }
  auto shm = wsync::demo::OwnerRank::Create(
      socket, group, buffers, absl::StrCat("/wsync-demo-", getpid(), "-", group, "-", r));
  if (!shm.ok()) return shm.status();
  return std::unique_ptr<wsync::demo::Owner>(*std::move(shm));
}

// Every rank's owner, registered with its worker.
absl::Status Demo::StartOwners() {
  src_owner_.resize(num_src_);
  dst_owner_.resize(num_dst_);
  for (int side = 0; side < 2; ++side) {
    const int n = side == 0 ? num_src_ : num_dst_;
    for (int r = 0; r < n; ++r) {
      auto o = MakeOwner(side, r);
      if (!o.ok()) return Err(absl::StrCat("owner: ", o.status().ToString()));
      auto& owner = side == 0 ? src_owner_[r] : dst_owner_[r];
      owner = *std::move(o);
      absl::Status s = owner->Register();
      if (!s.ok()) return Err(s.ToString());
    }
  }
  return absl::OkStatus();
}

// Counts the sync events inference rank 0's owner sees (an inference engine
// would pause/resume on them) until Finish cancels the stream.
void Demo::WatchEvents() {
  watcher_ = std::thread([this] {
    wsync::v1::SyncEventsRequest req;
    auto reader = dst_owner_[0]->stub().SyncEvents(&events_ctx_, req);
    wsync::v1::SyncEvent e;
    while (reader->Read(&e)) ++events_;
    reader->Finish();
  });
}

absl::Status Demo::DefineTransfer() {
  wsync::v1::DefineTransferRequest def;
  def.set_name("demo");
  def.set_source_group("trainer");
  def.set_destination_group("inference");
  *def.mutable_spec() = spec_;
  def.set_no_warm_up(!absl::GetFlag(FLAGS_warm_up));
  wsync::v1::DefineTransferResponse defined;
  grpc::Status gs = wsync::demo::CallWithDeadline(
      [&](grpc::ClientContext* c) { return cluster_->trainer().DefineTransfer(c, def, &defined); });
  if (!gs.ok()) return Err(absl::StrCat("DefineTransfer: ", gs.error_message()));
  const auto& sm = defined.summary();
  std::printf(
      "%s %s -> %s%s: %d workers, %.2f MiB into destinations (%.2f MiB network, %.2f MiB "
      "local), %d rounds, %lld buckets, planned in %.1f ms\n",
      co_.model.c_str(), absl::GetFlag(FLAGS_source).c_str(),
      absl::GetFlag(FLAGS_destination).c_str(), co_.colocated ? " (colocated)" : "",
      defined.num_workers(), sm.destination_bytes() / 1048576.0, sm.network_bytes() / 1048576.0,
      sm.local_bytes() / 1048576.0, sm.num_rounds(), static_cast<long long>(sm.num_buckets()),
      sm.plan_seconds() * 1e3);
  if (defined.warm_up_id().empty()) return absl::OkStatus();
  auto warm = wsync::demo::AwaitWarmUp(*cluster_, "demo", absl::Seconds(120), g_stop);
  if (!warm.ok()) return Err(warm.status().ToString());
  std::printf("warm-up %s: %s in %.2f ms%s%s\n", warm->id().c_str(),
              wsync::v1::WarmUpState_Name(warm->state()).c_str(), warm->seconds() * 1e3,
              warm->reason().empty() ? "" : ": ", warm->reason().c_str());
  return absl::OkStatus();
}

// Version v's values in every source rank, poison in every destination rank,
// both published; with --kill_in_version=v, first the sync that loses a
// worker (the destinations poisoned again after it).
absl::Status Demo::PrepareVersion(int v) {
  std::vector<absl::Status> fills(num_src_);
  ForEachRank(num_src_, [&](int r) {
    fills[r] = wsync::demo::FillSource(*src_side_, r, v, src_owner_[r]->memory());
  });
  absl::Status filled;
  for (const absl::Status& f : fills) filled.Update(f);
  if (!filled.ok()) return Err(absl::StrCat("fill: ", filled.ToString()));
  ForEachRank(num_dst_,
              [&](int r) { wsync::demo::Poison(dst_buffers_[r], dst_owner_[r]->memory()); });
  for (auto* owners : {&src_owner_, &dst_owner_}) {
    for (auto& o : *owners) {
      if (filled.ok()) filled = o->Publish();
    }
  }
  if (!filled.ok()) return Err(filled.ToString());
  if (v != absl::GetFlag(FLAGS_kill_in_version)) return absl::OkStatus();
  absl::Status s = wsync::demo::KillMidSync(*cluster_, v, dst_worker_[num_dst_ - 1], src_worker_,
                                            dst_worker_, src_owner_, dst_owner_, g_stop);
  for (int r = 0; r < num_dst_ && s.ok(); ++r) {
    wsync::demo::Poison(dst_buffers_[r], dst_owner_[r]->memory());
    s = dst_owner_[r]->Publish();
  }
  if (!s.ok()) return Err(absl::StrFormat("kill in v%d: %s", v, s.ToString()));
  return absl::OkStatus();
}

// Syncs version v and checks every destination byte.
absl::Status Demo::SyncVersion(int v) {
  const absl::Time t_fill = absl::Now();
  RETURN_IF_ERROR(PrepareVersion(v));
  const double fill_s = absl::ToDoubleSeconds(absl::Now() - t_fill);
  const absl::Time t0 = absl::Now();
  wsync::v1::SyncRequest sreq;
  sreq.set_transfer("demo");
  sreq.set_version(v);
  wsync::v1::SyncResponse sresp;
  grpc::Status gs = wsync::demo::CallWithDeadline(
      [&](grpc::ClientContext* c) { return cluster_->trainer().Sync(c, sreq, &sresp); });
  if (!gs.ok()) return Err(absl::StrFormat("Sync v%d: %s", v, gs.error_message()));
  wsync::v1::SyncStatus st;
  gs = wsync::demo::WaitUntilDone(*cluster_, sresp.sync_id(), g_stop, &st);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!gs.ok() || st.phase() != wsync::v1::SYNC_SUCCEEDED) {
    return Err(absl::StrFormat("sync v%d did not succeed: %s", v,
                               gs.ok() ? st.error() : gs.error_message()));
  }
  return VerifyVersion(v, sresp, st, wall, fill_s);
}

// Fetches and checks every destination rank; prints the version's result
// line.
absl::Status Demo::VerifyVersion(int v, const wsync::v1::SyncResponse& sresp,
                                 const wsync::v1::SyncStatus& st, double wall, double fill_s) {
  const absl::Time t_verify = absl::Now();
  // One thread per destination rank (each checks its own owner's memory).
  std::vector<absl::StatusOr<wsync::demo::VerifyResult>> results(num_dst_);
  ForEachRank(num_dst_, [&](int r) {
    absl::Status fetched = dst_owner_[r]->Fetch();
    results[r] = fetched.ok() ? wsync::demo::VerifyDestination(spec_, *dst_side_, *src_side_, r, v,
                                                               dst_owner_[r]->memory())
                              : fetched;
  });
  int64_t checked = 0, wrong = 0;
  std::string first;
  for (const auto& res : results) {
    if (!res.ok()) {
      first = res.status().ToString();
      ++wrong;
      continue;
    }
    checked += res->bytes;
    wrong += res->wrong_elements;
    if (first.empty()) first = res->first_error;
  }
  VersionFigures f;
  f.version = v;
  f.wall_s = wall;
  f.fill_s = fill_s;
  f.verify_s = absl::ToDoubleSeconds(absl::Now() - t_verify);
  f.checked_bytes = checked;
  f.wrong = wrong;
  f.result_line = absl::GetFlag(FLAGS_result_lines);
  wsync::demo::PrintVersionLines(f, sresp, st);
  if (wrong != 0) return Err(absl::StrFormat("WRONG BYTES in v%d: %s", v, first));
  return absl::OkStatus();
}

// A sync of the last version again must be refused; prints the
// controller's counters.
absl::Status Demo::CheckVersionsMoveForward() {
  const int versions = absl::GetFlag(FLAGS_versions);
  wsync::v1::SyncRequest old;
  old.set_transfer("demo");
  old.set_version(versions);
  wsync::v1::SyncResponse ignored;
  grpc::Status gs = wsync::demo::CallWithDeadline(
      [&](grpc::ClientContext* c) { return cluster_->trainer().Sync(c, old, &ignored); });
  const bool refused = gs.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  std::printf("re-sync of v%d refused: %s (%s)\n", versions, refused ? "yes" : "NO",
              gs.error_message().c_str());
  wsync::v1::GetStatusRequest sr;
  wsync::v1::GetStatusResponse status;
  if (wsync::demo::CallWithDeadline([&](grpc::ClientContext* c) {
        return cluster_->trainer().GetStatus(c, sr, &status);
      }).ok()) {
    std::printf(
        "plan cache: %lld hits, %lld misses; %d workers alive; sync events seen by "
        "inference rank 0's owner: %d\n",
        static_cast<long long>(status.plan_cache_hits()),
        static_cast<long long>(status.plan_cache_misses()), status.workers_alive(), events_.load());
  }
  // Counted as a failure, with no line of its own (the line above says NO).
  return refused ? absl::OkStatus() : absl::FailedPreconditionError("");
}

int Demo::SyncAll() {
  absl::Status s = DefineTransfer();
  const int versions = absl::GetFlag(FLAGS_versions);
  for (int v = 1; v <= versions && s.ok() && !g_stop.load(); ++v) s = SyncVersion(v);
  if (s.ok() && !g_stop.load()) return CheckVersionsMoveForward().ok() ? 0 : 1;
  if (!s.ok()) PrintFailure(s);
  return s.ok() ? 0 : 1;
}

int Demo::Finish(int failures) {
  events_ctx_.TryCancel();
  if (watcher_.joinable()) watcher_.join();
  cluster_->StopAll();
  if (g_stop.load()) {
    std::printf("interrupted; everything stopped\n");
    return 130;
  }
  std::printf("%s\n", failures == 0 ? "OK: every destination byte verified" : "FAILED");
  return failures == 0 ? 0 : 1;
}

// Failures before the syncs print one "demo: ..." line and exit 2 (bad
// case or flags) or 1.
int Run() {
  Demo demo;
  absl::Status s = demo.Prepare();
  if (!s.ok()) {
    PrintFailure(s);
    return 2;
  }
  s = demo.Start();
  if (!s.ok()) {
    PrintFailure(s);
    return 1;
  }
  return demo.Finish(demo.SyncAll());
}

}  // namespace

int main(int argc, char** argv) {
  wsync::InitLogging("wsync-demo");
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
    // Plain, like the failure lines (scripts/gpu_run.sh shows "demo:" lines).
    std::fprintf(stderr, "demo: signal %d, stopping\n", sig);
    g_stop.store(true);
    sigwait(&signals, &sig);
    _exit(130);
  }).detach();
  return Run();
}
