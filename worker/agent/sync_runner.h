// Runs the syncs assigned to this worker, one at a time: looks up (or caches)
// the op list by plan key, binds it to the owner-registered buffers, builds
// the transfer's transport once per generation (Gloo over host memory, or
// NCCL over device memory on a worker with a GPU plane; either rendezvous
// through the controller), and replays the op list with the Executor.
// Abort() may come from any thread.
#ifndef WSYNC_WORKER_AGENT_SYNC_RUNNER_H_
#define WSYNC_WORKER_AGENT_SYNC_RUNNER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "worker/agent/gpu_plane.h"
#include "worker/agent/peer_buffers.h"
#include "worker/agent/tensor_table.h"
#include "worker/agent/worker_metrics.h"
#include "worker/exec/buffer_registry.h"
#include "worker/exec/executor.h"
#include "worker/backends/host/host_data_ops.h"
#include "worker/plane/transport.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::agent {

// The transport of a plan that moves nothing over the network (only local
// copies, or nothing at all for this worker): it has a rank but refuses any
// request, so a plan that needs a network never runs on it silently.
class LocalOnlyTransport : public transport::Transport {
 public:
  LocalOnlyTransport(int32_t rank, int32_t size,
                     transport::MemorySpace space = transport::MemorySpace::kHost)
      : rank_(rank), size_(size), space_(space) {}
  std::string Name() const override { return "local-only"; }
  transport::MemorySpace memory_space() const override { return space_; }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  using transport::Transport::RunRound;
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const std::function<void()>& on_posted) override;
  void Abort(const std::string& reason) override {}

 private:
  const int32_t rank_;
  const int32_t size_;
  const transport::MemorySpace space_;
};

struct RunnerOptions {
  std::string data_address = "127.0.0.1";  // Gloo listen/advertise address
  absl::Duration round_timeout = absl::Seconds(60);
  int64_t staging_limit_bytes = 0;  // ExecutorOptions::staging_limit_bytes
  // Not owned; null on a host worker. With one, buffers are device memory and
  // transfers run over NCCL.
  GpuPlane* gpu = nullptr;
};

class SyncRunner {
 public:
  // progress(rounds_done, rounds_total, bytes_into_this_worker)
  using ProgressFn = std::function<void(int32_t, int32_t, int64_t)>;

  SyncRunner(TensorTable* tensors, WorkerMetrics* metrics, RunnerOptions options)
      : tensors_(tensors), metrics_(metrics), options_(std::move(options)), peers_(options_.gpu) {}

  // Runs one assignment to the end (success, failure, abort or deadline) and
  // returns the report for the controller (lease id left empty).
  v1::ReportResultRequest Run(const v1::SyncAssignment& a,
                              std::shared_ptr<v1::WorkerService::Stub> stub,
                              const std::string& lease_id, const ProgressFn& progress);

  // Aborts sync `sync_id` if it is running (empty: whatever runs).
  void Abort(const std::string& sync_id, const std::string& reason);

  // Drops every transport (e.g. after the lease was lost).
  void DropTransports();

 private:
  struct Channel {  // one transfer's data plane
    int64_t generation = -1;
    std::unique_ptr<transport::Transport> transport;
    std::unique_ptr<exec::DataOps> ops;
    std::unique_ptr<exec::Executor> executor;
  };

  absl::Status RefreshRegistry();
  // The assignment's direct writes, with the peers' buffers mapped; *key
  // identifies them for the bound-plan cache (empty: none).
  absl::Status PrepareDirectWrites(const v1::SyncAssignment& a, exec::DirectWrites* direct,
                                   std::string* key);
  // Device memory with a GPU plane, else host memory.
  transport::MemorySpace Space() const;
  // Gives `ch` (its transport set) data ops and an executor.
  absl::Status AttachExecutor(Channel& ch);
  std::string AbortReason();
  absl::StatusOr<Channel*> EnsureChannel(const v1::SyncAssignment& a,
                                         std::shared_ptr<v1::WorkerService::Stub> stub,
                                         const std::string& lease_id);

  TensorTable* const tensors_;
  WorkerMetrics* const metrics_;
  const RunnerOptions options_;

  // Owned by the running thread.
  std::map<std::string, std::shared_ptr<const v1::Plan>> plans_;  // "<key>/<worker>"
  exec::BufferRegistry registry_;
  TensorSnapshot snapshot_;  // keeps mappings alive for the registry
  bool have_snapshot_ = false;
  PeerMapsByTransfer peers_;  // direct writes: the peers' buffers
  // "<key>/<worker>" -> (direct-writes key, the plan bound with them).
  std::map<std::string, std::pair<std::string, std::shared_ptr<const exec::BoundPlan>>> bound_;
  std::map<std::string, std::unique_ptr<Channel>> channels_;  // by transfer (+ "#local")

  absl::Mutex mu_;
  std::string running_ ABSL_GUARDED_BY(mu_);
  exec::Executor* running_executor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  // Aborts that arrived before their sync started running.
  std::map<std::string, std::string> early_aborts_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> aborted_{false};
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_SYNC_RUNNER_H_
