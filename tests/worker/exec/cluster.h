// Test harness: N workers as threads of this process, each with host
// buffers, a BufferRegistry, a Gloo transport over loopback, HostDataOps (or,
// with `lazy_ops`, LazyDataOps: every call deferred as far as allowed) and an
// Executor.
#ifndef WSYNC_TESTS_WORKER_EXEC_CLUSTER_H_
#define WSYNC_TESTS_WORKER_EXEC_CLUSTER_H_

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/plan/routes.h"
#include "tests/worker/exec/lazy_data_ops.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/executor.h"
#include "worker/backends/host/host_data_ops.h"
#include "worker/backends/host/gloo_transport.h"
#include "worker/plane/kv_store.h"

namespace wsync::exec::testing {

constexpr uint8_t kSentinel = 0xEE;

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
  // `from` expects another ready token from `to` than `to` sends (as if
  // `to`'s owner registered again after `from` mapped its buffers).
  void StaleMapping(int from, int to) { stale_.insert({from, to}); }
  Executor& executor(int worker) { return *workers_[worker].executor; }
  // `worker` runs its syncs on `ops` (owned by the caller; set before Connect).
  void UseOps(int worker, DataOps* ops) { workers_[worker].custom_ops = ops; }
  // `worker`'s executor gets wrap(its Gloo transport) (set before Connect).
  using TransportWrapper =
      std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>;
  void WrapTransport(int worker, TransportWrapper wrap) { workers_[worker].wrap = std::move(wrap); }

  absl::Status Connect(ExecutorOptions options = {}) {
    static std::atomic<int> counter{0};
    const std::string prefix = absl::StrCat("exec/", getpid(), "/", counter++);
    std::vector<absl::Status> status(n_);
    std::vector<std::thread> threads;
    for (int w = 0; w < n_; ++w) {
      threads.emplace_back([&, w] {
        transport::GlooTransportOptions o;
        o.rank = w;
        o.size = n_;
        o.store = &store_;
        o.prefix = prefix;
        o.connect_timeout = absl::Seconds(30);
        auto t = transport::GlooTransport::Create(o);
        status[w] = t.status();
        if (t.ok()) workers_[w].transport = std::move(*t);
      });
    }
    for (auto& t : threads) t.join();
    for (int w = 0; w < n_; ++w) {
      if (!status[w].ok()) return status[w];
      DataOps* ops = lazy_ops_ ? static_cast<DataOps*>(&workers_[w].lazy) : &workers_[w].ops;
      if (workers_[w].custom_ops != nullptr) ops = workers_[w].custom_ops;
      if (workers_[w].wrap)
        workers_[w].transport = workers_[w].wrap(std::move(workers_[w].transport));
      workers_[w].executor = std::make_unique<Executor>(workers_[w].transport.get(), ops, options);
    }
    return absl::OkStatus();
  }

  // Binds and runs `plan` on every worker not in `silent` (those keep their
  // transport but never post anything). Returns each worker's result.
  std::vector<absl::StatusOr<SyncStats>> Run(const v1::Plan& plan, absl::Duration timeout,
                                             const std::set<int>& silent = {},
                                             const ProgressCallback& progress = nullptr) {
    std::vector<absl::StatusOr<SyncStats>> out(n_, absl::UnknownError("not run"));
    // The WriteDirectly pairs, routed as the controller's route stage does.
    v1::Plan routed = plan;
    plan::MarkPeerWrites(std::vector<plan::WorkerPair>(direct_.begin(), direct_.end()), &routed);
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
        out[w] = workers_[w].executor->Run(**bound, workers_[w].registry.generation(),
                                           absl::Now() + timeout, progress);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

 private:
  struct Worker {
    std::map<std::pair<BufferSide, std::string>, std::vector<uint8_t>> buffers;
    BufferRegistry registry;
    HostDataOps ops;
    LazyDataOps lazy;
    DataOps* custom_ops = nullptr;
    TransportWrapper wrap;
    std::unique_ptr<transport::Transport> transport;
    std::unique_ptr<Executor> executor;
  };
  const int n_;
  const bool lazy_ops_;
  transport::InMemoryKvStore store_;
  std::vector<Worker> workers_;
  std::set<std::pair<int, int>> direct_;
  std::set<std::pair<int, int>> stale_;
};

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_CLUSTER_H_
