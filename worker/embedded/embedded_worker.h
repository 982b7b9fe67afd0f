// The worker agent run inside the owner's process (the embedded worker): the
// agent wsync-worker runs (controller lease, assignment stream, SyncRunner,
// optional /metrics), built through the same composition root
// (node::CreateBackend: the host backend, or the CUDA one in a CUDA build
// when a device is given), with the owner's tensors registered by pointer
// instead of over the local Unix-socket API. Nothing is shared with other
// processes: the worker takes no part in direct writes (it advertises no
// memory domain), so every bucket to or from it goes over the transport,
// unless its other end is a tensor another process registered with it over
// `local_socket` (then it is a local copy).
//
// Lifecycle: Create -> [Register]* -> Start -> [Register | SetServing | Status |
// events]*
// -> Stop. Stop is final (ends the lease: the controller sees the assignment
// stream close and drops the worker), idempotent, and joins every thread;
// calls after it are FAILED_PRECONDITION. Thread-safe.
#ifndef WSYNC_WORKER_EMBEDDED_EMBEDDED_WORKER_H_
#define WSYNC_WORKER_EMBEDDED_EMBEDDED_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/agent/agent.h"
#include "worker/agent/controller_channel.h"
#include "worker/agent/local_endpoint.h"
#include "worker/agent/weight_arenas.h"
#include "worker/agent/worker_metrics.h"
#include "worker/plane/backend.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::embedded {

// wsync-worker's flags, for a worker in this process.
struct EmbeddedOptions {
  std::string controller = "127.0.0.1:50051";
  std::vector<v1::Membership> memberships;  // at least one
  std::string node;                         // "": the host name
  int device = -1;                          // CUDA device; -1: host memory over Gloo
  std::string data_address = "127.0.0.1";
  int32_t metrics_port = -1;  // -1: no /metrics endpoint; 0: any free port
  std::string metrics_host = "127.0.0.1";
  absl::Duration round_timeout = absl::Seconds(60);
  int64_t staging_limit_bytes = 0;
  // Staged syncs (docs/staging.md): the most shadow memory one may allocate
  // on this worker (wsync-worker's --staging_budget_bytes); 0: no limit.
  int64_t staging_budget_bytes = 0;
  std::string instance_id;  // "": random
  // TLS to the controller (docs/security.md); insecure: plaintext.
  agent::ControllerTls tls;
  // "": this process's tensors only. Else the local API (and its descriptor
  // socket) is also served on this Unix socket, so that other processes on
  // the worker's device register theirs too (CUDA IPC, descriptors, shared
  // memory), e.g. a colocated trainer's shards beside a vLLM rank's weights:
  // one worker then holds both memberships and copies locally. Its directory
  // must be private to this user (agent/local_socket.h); only this user's
  // processes may connect.
  std::string local_socket;
  // The low-latency mode (wsync-worker's --busy_poll_ms, common/busy_poll.h):
  // -1 spin forever, 0 off, N > 0 spin N ms after each activity.
  int64_t busy_poll_ms = 0;
  // The controller's control fast lane (wsync-worker's --controller_lane,
  // agent/lane_reporter.h); empty: gRPC only.
  std::string controller_lane;
  // Flip commits (docs/commit-flip.md): how long a staged sync into a flip
  // pair waits for the owner's AckFlip of the pair's last flip before it
  // fails (naming the flip and the arena).
  absl::Duration flip_ack_wait = absl::Seconds(30);
};

// One tensor of this process, by pointer.
struct PointerTensor {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  uintptr_t data = 0;
  int64_t bytes = 0;           // of the memory at `data` (at least elements * dtype size)
  int device = -1;             // CUDA device of `data`; -1: host memory
  std::shared_ptr<void> hold;  // keeps the memory alive while the worker may touch it
};

// A remappable arena for the owner's weights (docs/commit-swap.md).
struct WeightArena {
  int64_t handle = 0;  // for FreeWeightArena
  uintptr_t base = 0;  // first byte; stays for the arena's life
  int64_t bytes = 0;   // at least the size asked for (granularity-rounded)
  int device = -1;     // CUDA device; -1: host memory
  // Keeps the memory alive (the owner's tensors over it hold this).
  std::shared_ptr<void> hold;
};

class EmbeddedWorker {
 public:
  // INVALID_ARGUMENT for bad options; the backend's error when it cannot be
  // made (e.g. a device without a CUDA build); the metrics endpoint's when it
  // cannot bind.
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> Create(EmbeddedOptions options);
  ~EmbeddedWorker();

  // Starts the lease and the sync thread. FAILED_PRECONDITION when already
  // started or stopped.
  absl::Status Start();
  void Stop();
  bool running() const;
  bool stopped() const;

  // Registers `tensors` for `group` (replace: drop the group's others).
  // Errors name the tensor: those of TensorTable::RegisterLocal, and
  // FAILED_PRECONDITION for a tensor on another device than the worker's or
  // a stopped worker. A bad entry changes nothing.
  absl::StatusOr<v1::RegisterTensorsResponse> Register(const std::string& group,
                                                       std::vector<PointerTensor> tensors,
                                                       bool replace);
  // A weight arena of at least `bytes` bytes on `device` (the worker's own:
  // -1 for a host worker), named `name` in messages ("" names it by its
  // handle). Tensors the owner places in it and registers commit staged
  // syncs by swapping the arena's memory with a twin instead of copying
  // (docs/commit-swap.md). FAILED_PRECONDITION for another device or a
  // stopped worker; the backend's error (naming the arena and this worker)
  // when it has none or the memory is not there.
  absl::StatusOr<WeightArena> CreateWeightArena(int device, int64_t bytes,
                                                const std::string& name = "");
  // Forgets `handle` (NOT_FOUND when unknown): later syncs copy into its
  // tensors. Its memory lives while the owner holds WeightArena::hold.
  absl::Status FreeWeightArena(int64_t handle);
  // Two weight arenas of at least `bytes` bytes each, "<name>.0" and
  // "<name>.1", that the owner keeps its weights in turn by turn
  // (docs/commit-flip.md): it places them in the first (the same offsets
  // stand for the same tensors in both), registers them and serves from
  // there; a staged sync whose destinations all lie in one arena of the
  // pair writes the other, and its commit moves the registered tensors onto
  // it and says so in the COMMITTED event (commit_kind "flip", flipped_onto:
  // the handle). The owner then switches its own pointers before its next
  // step and calls AckFlip; the next staged sync into the pair waits for it
  // (EmbeddedOptions::flip_ack_wait). Errors as CreateWeightArena's.
  absl::StatusOr<std::pair<WeightArena, WeightArena>> CreateFlipArenas(
      int device, int64_t bytes, const std::string& name = "");
  // The owner serves from arena `handle` now (after a flip onto it): no work
  // it queues from now on reads the arena it left; work queued before is
  // waited for by the worker before it writes that arena. NOT_FOUND for an
  // unknown handle; FAILED_PRECONDITION naming the arena when no flip onto
  // it awaits an acknowledgement.
  absl::Status AckFlip(int64_t handle);
  v1::LocalStatusResponse Status();
  // The version the owner serves for `req.group()` (worker/agent/serving.h):
  // reported to the controller with the next heartbeat and on /metrics.
  // INVALID_ARGUMENT naming the group for a bad request; FAILED_PRECONDITION
  // once stopped.
  absl::Status SetServing(const v1::SetServingRequest& req);
  // Holds syncs off ("" admits them): agent::WorkerAgent::HoldSyncs (the
  // sync id of a commit in progress it waited for, or DEADLINE_EXCEEDED).
  absl::StatusOr<std::string> HoldSyncs(std::string reason);
  // Sync events from now on (as the local API's SyncEvents stream).
  // `who` names the subscriber in errors (agent::WorkerAgent::Subscribe).
  std::shared_ptr<agent::EventQueue> Subscribe(
      const std::string& who = "embedded owner, in-process events");
  void Unsubscribe(const std::shared_ptr<agent::EventQueue>& q);

  std::string backend_name() const { return backend_->Name(); }
  int metrics_port() const;  // -1 without an endpoint
  const EmbeddedOptions& options() const { return options_; }

 private:
  EmbeddedWorker(EmbeddedOptions options, std::unique_ptr<plane::Backend> backend,
                 agent::ControllerCredentialSet credentials,
                 std::unique_ptr<agent::LocalEndpoint> local);
  std::string Roles() const;
  absl::Status CheckArenaDevice(int device, const std::string& who) const;

  const EmbeddedOptions options_;
  const std::unique_ptr<plane::Backend> backend_;
  agent::WeightArenas arenas_;  // read by agent_'s sync thread
  agent::WorkerMetrics metrics_;
  std::unique_ptr<agent::WorkerAgent> agent_;
  // Null without options.local_socket; serves agent_, so it goes first.
  std::unique_ptr<agent::LocalEndpoint> local_;  // reset by Stop, under mu_

  mutable absl::Mutex mu_;  // serialises lifecycle changes with registrations
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wsync::embedded

#endif  // WSYNC_WORKER_EMBEDDED_EMBEDDED_WORKER_H_
