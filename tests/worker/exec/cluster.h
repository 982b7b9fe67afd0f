// Test harness: N workers as threads of this process, each with host
// buffers, a BufferRegistry and a channel built by the composition root
// (node::DataPlane over the host backend: a Gloo transport over loopback,
// HostDataOps, HostPeerWriter and an Executor). With `lazy_ops` each channel
// runs on LazyDataOps instead (every call deferred as far as allowed); a test
// may lend a worker its own data ops, peer writer or transport wrapper.
#ifndef WSYNC_TESTS_WORKER_EXEC_CLUSTER_H_
#define WSYNC_TESTS_WORKER_EXEC_CLUSTER_H_

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/plan/put_phases.h"
#include "controller/plan/routes.h"
#include "tests/worker/exec/borrowed_plane.h"
#include "tests/worker/exec/lazy_data_ops.h"
#include "worker/backends/host/host_backend.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/executor.h"
#include "worker/node/data_plane.h"
#include "worker/plane/kv_store.h"

namespace wsync::exec::testing {

constexpr uint8_t kSentinel = 0xEE;
// The two sides, short, as the executor tests name them.
inline constexpr BufferSide kSrc = BufferSide::kSource;
inline constexpr BufferSide kDst = BufferSide::kDestination;

using TransportWrapper =
    std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>;

// The host backend of one cluster worker, with the parts a test lends it.
class ClusterBackend : public host::HostBackend {
 public:
  ClusterBackend() : HostBackend(plane::BackendConfig()) {}

  bool lazy = false;             // each channel's data ops and writer: one LazyDataOps
  DataOps* ops = nullptr;        // lent data ops (a PeerWriter too: also the writer)
  PeerWriter* writer = nullptr;  // lent writer
  TransportWrapper wrap;

  absl::StatusOr<std::unique_ptr<DataOps>> NewDataOps() override {
    if (ops != nullptr) return std::make_unique<testing::BorrowedDataOps>(ops);
    if (lazy) return std::make_unique<LazyDataOps>();
    return HostBackend::NewDataOps();
  }
  absl::StatusOr<std::unique_ptr<PeerWriter>> NewPeerWriter(DataOps& channel_ops) override {
    PeerWriter* lent = writer;
    if (lent == nullptr && ops != nullptr) lent = dynamic_cast<PeerWriter*>(ops);
    if (lent == nullptr && lazy) lent = dynamic_cast<LazyDataOps*>(&channel_ops);
    if (lent != nullptr) return std::make_unique<testing::BorrowedPeerWriter>(lent);
    return HostBackend::NewPeerWriter(channel_ops);
  }
  absl::StatusOr<std::unique_ptr<transport::Transport>> Connect(
      const plane::ConnectOptions& options) override {
    auto t = HostBackend::Connect(options);
    if (!t.ok() || !wrap) return t;
    return wrap(*std::move(t));
  }
};

class Cluster {
 public:
  explicit Cluster(int n, bool lazy_ops = false) : n_(n), lazy_ops_(lazy_ops), workers_(n) {}

  // A host buffer of `numel` elements filled with kSentinel bytes, registered.
  std::vector<uint8_t>& Add(int worker, BufferSide side, const std::string& name, DType dtype,
                            int64_t numel) {
    auto& buf = workers_[worker].buffers[{side, name}];
    buf.assign(static_cast<size_t>(numel * DTypeSize(dtype)), kSentinel);
    RegisteredBuffer r;
    r.data = buf.data();
    r.bytes = static_cast<int64_t>(buf.size());
    r.dtype = dtype;
    const absl::Status s = workers_[worker].registry.Register(side, name, r);
    if (!s.ok()) ADD_FAILURE() << s;
    return buf;
  }
  template <typename T>
  T* Data(int worker, BufferSide side, const std::string& name) {
    return reinterpret_cast<T*>(workers_[worker].buffers.at({side, name}).data());
  }
  BufferRegistry& registry(int worker) { return workers_[worker].registry; }
  // Later runs write the buckets `from` sends to `to` straight into `to`'s
  // buffers (direct writes; all workers share this process's memory).
  void WriteDirectly(int from, int to) { direct_.insert({from, to}); }
  // The put phases of Run's plans, by bucket id, instead of PlanPutPhases'.
  void SetPutPhases(std::vector<int32_t> phases) { put_phases_ = std::move(phases); }
  // `from` expects another ready token from `to` than `to` sends (as if
  // `to`'s owner registered again after `from` mapped its buffers).
  void StaleMapping(int from, int to) { stale_.insert({from, to}); }
  Executor& executor(int worker) { return *workers_[worker].channel->executor; }
  // Later runs of `worker` pass its executor a registry generation its
  // plan was not bound against (as if its owner registered again between
  // the binding and the run): its Run fails before its tokens.
  void SkewGeneration(int worker) { skewed_.insert(worker); }
  // `worker` runs its syncs on `ops` (owned by the caller; set before
  // Connect), which also writes its peers if it is a PeerWriter.
  void UseOps(int worker, DataOps* ops) { workers_[worker].backend.ops = ops; }
  // `worker` writes its peers with `writer` (owned by the caller; set before
  // Connect).
  void UseWriter(int worker, PeerWriter* writer) { workers_[worker].backend.writer = writer; }
  // `worker`'s executor gets wrap(its Gloo transport) (set before Connect).
  void WrapTransport(int worker, TransportWrapper wrap) {
    workers_[worker].backend.wrap = std::move(wrap);
  }

  absl::Status Connect(ExecutorOptions options = {}) {
    static std::atomic<int> counter{0};
    const std::string prefix = absl::StrCat("exec/", getpid(), "/", counter++);
    std::vector<absl::Status> status(n_);
    std::vector<std::thread> threads;
    for (int w = 0; w < n_; ++w) {
      threads.emplace_back([&, w] {
        Worker& wk = workers_[w];
        wk.backend.lazy = lazy_ops_;
        wk.plane = std::make_unique<node::DataPlane>(&wk.backend, options);
        plane::ConnectOptions o;
        o.store = &store_;
        o.prefix = prefix;
        o.rank = w;
        o.size = n_;
        o.deadline = absl::Now() + absl::Seconds(30);
        auto ch = wk.plane->Connect(o);
        status[w] = ch.status();
        if (ch.ok()) wk.channel = *std::move(ch);
      });
    }
    for (auto& t : threads) t.join();
    for (int w = 0; w < n_; ++w) {
      if (!status[w].ok()) return status[w];
    }
    return absl::OkStatus();
  }

  // Binds and runs `plan` on every worker not in `silent` (those keep their
  // transport but never post anything). Returns each worker's result.
  std::vector<absl::StatusOr<SyncStats>> Run(const v1::Plan& plan, absl::Duration timeout,
                                             const std::set<int>& silent = {},
                                             const ProgressCallback& progress = nullptr) {
    std::vector<absl::StatusOr<SyncStats>> out(n_, absl::UnknownError("not run"));
    // The WriteDirectly pairs, routed and put in phases as the controller's
    // route stage does (or in the phases SetPutPhases gave).
    v1::Plan routed = plan;
    const std::vector<plan::WorkerPair> pairs(direct_.begin(), direct_.end());
    const std::vector<int32_t> phases =
        put_phases_ ? *put_phases_ : plan::PlanPutPhases(plan, pairs).phase_of_bucket;
    plan::MarkPeerWrites(pairs, &routed, phases);
    std::vector<std::thread> threads;
    for (int w = 0; w < n_; ++w) {
      if (silent.count(w)) continue;
      threads.emplace_back([&, w] {
        DirectWrites direct;
        direct.ready_token = 1000 + w;
        for (const auto& [from, to] : direct_) {
          if (from != w) continue;
          direct.peer_buffers[to] = &workers_[to].registry;
          direct.expected_ready_tokens[to] = 1000 + to + (stale_.count({from, to}) ? 1 : 0);
        }
        auto bound = BindPlan(routed, w, workers_[w].registry, MemorySpace::kHost, &direct);
        if (!bound.ok()) {
          out[w] = bound.status();
          return;
        }
        const uint64_t generation = workers_[w].registry.generation() + skewed_.count(w);
        out[w] = workers_[w].channel->executor->Run(**bound, generation, absl::Now() + timeout,
                                                    progress);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

 private:
  struct Worker {
    std::map<std::pair<BufferSide, std::string>, std::vector<uint8_t>> buffers;
    BufferRegistry registry;
    ClusterBackend backend;
    std::unique_ptr<node::DataPlane> plane;
    std::unique_ptr<node::Channel> channel;
  };
  const int n_;
  const bool lazy_ops_;
  transport::InMemoryKvStore store_;
  std::vector<Worker> workers_;
  std::set<std::pair<int, int>> direct_;
  std::optional<std::vector<int32_t>> put_phases_;
  std::set<std::pair<int, int>> stale_;
  std::set<int> skewed_;
};

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_CLUSTER_H_
