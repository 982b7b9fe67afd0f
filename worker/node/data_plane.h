// The composition root of a worker's data plane: built from one Backend, it
// makes and keeps the per-transfer channels (transport + data ops + peer
// writer + executor). The agent (worker/agent/sync_runner), the GPU sync
// benchmark and the executor tests all build their workers through it.
#ifndef WSYNC_WORKER_NODE_DATA_PLANE_H_
#define WSYNC_WORKER_NODE_DATA_PLANE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/exec/executor.h"
#include "worker/plane/backend.h"

namespace wsync::node {

// One transfer's data plane. Members are destroyed executor first.
struct Channel {
  int64_t generation = -1;  // of the transfer's transport (-1: local only)
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<exec::DataOps> ops;
  std::unique_ptr<exec::PeerWriter> writer;
  std::unique_ptr<exec::Executor> executor;
};

// What a transfer's channel must be (the assignment's TransportSetup).
struct ChannelSpec {
  bool network = false;  // false: only local work (LocalOnlyTransport)
  int64_t generation = -1;
  plane::TransportKind kind = v1::TRANSPORT_KIND_UNSPECIFIED;  // must be the backend's transport
  plane::ConnectOptions connect;  // rank, size, prefix, deadline, cancel (store: see Ensure)
};

class DataPlane {
 public:
  // `backend` is not owned and outlives the plane.
  DataPlane(plane::Backend* backend, exec::ExecutorOptions options)
      : backend_(backend), options_(options) {}

  plane::Backend& backend() const { return *backend_; }

  // A channel over a new transport of the backend.
  absl::StatusOr<std::unique_ptr<Channel>> Connect(const plane::ConnectOptions& options);
  // A channel whose plans move nothing over the network.
  absl::StatusOr<std::unique_ptr<Channel>> LocalOnly(int32_t rank, int32_t size);
  // A channel over `transport` (in this backend's memory space).
  absl::StatusOr<std::unique_ptr<Channel>> Attach(std::unique_ptr<transport::Transport> transport,
                                                  int64_t generation = -1);

  // The channel of `transfer` for `spec`: kept while the generation and rank
  // stay the same (a local-only one while the rank does), else built afresh
  // (the old one first closed) with a rendezvous through `store()`'s store.
  // Errors name the transport, generation and rank.
  absl::StatusOr<Channel*> Ensure(
      const std::string& transfer, const ChannelSpec& spec,
      const std::function<std::unique_ptr<transport::KvStore>()>& store);
  // Drops `transfer`'s channels (after a failure: its transport is unusable).
  void Drop(const std::string& transfer);
  void DropAll() { channels_.clear(); }
  // Channels Ensure built so far (network and local-only).
  int64_t channels_created() const { return channels_created_; }

 private:
  absl::Status Complete(Channel& ch);

  plane::Backend* const backend_;
  const exec::ExecutorOptions options_;
  std::map<std::string, std::unique_ptr<Channel>> channels_;  // by transfer (+ "#local")
  int64_t channels_created_ = 0;
};

}  // namespace wsync::node

#endif  // WSYNC_WORKER_NODE_DATA_PLANE_H_
