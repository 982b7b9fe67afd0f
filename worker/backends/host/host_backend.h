// The host backend: tensors in POSIX shared memory registered by owner
// processes, HostDataOps, Gloo over TCP, and direct writes into peers'
// shared memory (HostPeerWriter).
#ifndef WSYNC_WORKER_BACKENDS_HOST_HOST_BACKEND_H_
#define WSYNC_WORKER_BACKENDS_HOST_HOST_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/plane/backend.h"

namespace wsync::host {

class HostBackend : public plane::Backend {
 public:
  explicit HostBackend(plane::BackendConfig config) : config_(std::move(config)) {}

  std::string Name() const override { return "host"; }
  plane::TransportKind transport_kind() const override { return v1::TRANSPORT_GLOO; }
  plane::MemorySpace memory_space() const override { return plane::MemorySpace::kHost; }
  std::vector<std::string> capabilities() const override { return {}; }

  absl::StatusOr<plane::OpenedBuffer> OpenBuffer(const plane::BufferLocation& where, int64_t bytes,
                                                 bool peer, const std::string& what,
                                                 plane::MappingCache* cache) override;
  absl::StatusOr<std::unique_ptr<exec::DataOps>> NewDataOps() override;
  absl::StatusOr<std::unique_ptr<transport::Transport>> Connect(
      const plane::ConnectOptions& options) override;
  absl::StatusOr<std::unique_ptr<exec::PeerWriter>> NewPeerWriter(exec::DataOps& ops) override;
  std::string MemoryDomain() const override;
  // memfd arenas (host_swap_arena.h).
  absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewSwapArena(int64_t bytes,
                                                                 const std::string& name) override;

 private:
  const plane::BackendConfig config_;
};

// The registry's factory (worker/node/backend_registry.cc).
absl::StatusOr<std::unique_ptr<plane::Backend>> CreateHostBackend(
    const plane::BackendConfig& config);

}  // namespace wsync::host

#endif  // WSYNC_WORKER_BACKENDS_HOST_HOST_BACKEND_H_
