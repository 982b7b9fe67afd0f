// The CUDA backend: tensors in device memory registered by owner processes
// through CUDA IPC (IpcRegistry), CudaDataOps, the NCCL transport, and
// direct writes into peers' IPC-mapped memory (CudaPeerWriter).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_BACKEND_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/ipc_registry.h"
#include "worker/plane/backend.h"

namespace wsync::cuda {

class CudaBackend : public plane::Backend {
 public:
  // FAILED_PRECONDITION when the device does not exist. `ops_options` shape
  // every channel's CudaDataOps (its device is set to `device`).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device,
                                                             CudaDataOps::Options ops_options = {});

  std::string Name() const override;
  plane::TransportKind transport_kind() const override { return v1::TRANSPORT_NCCL; }
  plane::MemorySpace memory_space() const override { return plane::MemorySpace::kCuda; }
  // "cuda_ipc", "cuda_vmm" and "nccl=<major.minor.patch>", the version of
  // the libnccl this process loaded (ranks of one communicator must agree).
  std::vector<std::string> capabilities() const override;
  std::string device_uuid() const override { return ipc_->uuid(); }

  // Each allocation base is mapped once however many buffers live in it
  // (the IpcRegistry counts the holds), and unmapped with the last; a peer
  // buffer may live on any GPU of WritableDevices().
  absl::StatusOr<plane::OpenedBuffer> OpenBuffer(const plane::BufferLocation& where, int64_t bytes,
                                                 bool peer, const std::string& what,
                                                 plane::MappingCache* cache) override;
  absl::StatusOr<std::unique_ptr<exec::DataOps>> NewDataOps() override;
  absl::StatusOr<std::unique_ptr<transport::Transport>> Connect(
      const plane::ConnectOptions& options) override;
  // `ops` must be this backend's CudaDataOps.
  absl::StatusOr<std::unique_ptr<exec::PeerWriter>> NewPeerWriter(exec::DataOps& ops) override;
  std::string MemoryDomain() const override;
  // cuMem arenas on this device (cuda_swap_arena.h).
  absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewSwapArena(int64_t bytes,
                                                                 const std::string& name) override;
  std::vector<std::string> WritableDevices() const override { return ipc_->writable_uuids(); }
  int64_t slow_peer_mappings() const override { return ipc_->slow_peer_mappings(); }

  int device() const { return ipc_->device(); }

 private:
  CudaBackend(std::unique_ptr<IpcRegistry> ipc, CudaDataOps::Options ops_options)
      : ipc_(std::move(ipc)), ops_options_(ops_options) {}

  // CUDA virtual memory from the owner's descriptors (vmm_import.h).
  absl::StatusOr<plane::OpenedBuffer> OpenVmm(const plane::BufferLocation& where, int64_t bytes,
                                              bool peer, const std::string& what,
                                              plane::MappingCache* cache);

  // Outlives every buffer it opened (the worker destroys its tensors first).
  std::unique_ptr<IpcRegistry> ipc_;
  const CudaDataOps::Options ops_options_;
};

// The registry's factory (worker/node/backend_registry.cc): config.device.
absl::StatusOr<std::unique_ptr<plane::Backend>> CreateCudaBackend(
    const plane::BackendConfig& config);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_BACKEND_H_
