// The GPU data plane of a worker started with --device: opens the CUDA IPC
// handles its owner process registers, and builds each transfer's NCCL
// transport (rendezvous through the controller) and CUDA data ops. Only the
// WSYNC_WITH_CUDA build has one (gpu_plane_cuda.cc); elsewhere CreateGpuPlane
// says what to rebuild (gpu_plane_none.cc), so the host build never needs
// CUDA headers here.
#ifndef WSYNC_WORKER_AGENT_GPU_PLANE_H_
#define WSYNC_WORKER_AGENT_GPU_PLANE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/plane/data_ops.h"
#include "worker/plane/kv_store.h"
#include "worker/plane/transport.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

class GpuPlane {
 public:
  virtual ~GpuPlane() = default;

  virtual int device() const = 0;
  // "GPU-..." of that device.
  virtual const std::string& uuid() const = 0;

  // This process's device pointer to a registered tensor. Each allocation
  // base is mapped once however many tensors live in it, and unmapped when
  // the last pointer into it is dropped; the range is checked against it.
  // `what` names the tensor in errors.
  virtual absl::StatusOr<std::shared_ptr<void>> Open(const v1::CudaIpc& ipc,
                                                     const std::string& what) = 0;
  // The same for a peer worker's buffer (direct writes): it may live on any
  // GPU of writable_uuids().
  virtual absl::StatusOr<std::shared_ptr<void>> OpenPeer(const v1::CudaIpc& ipc,
                                                         const std::string& what) = 0;
  // GPUs this device writes into over peer access, itself included.
  virtual const std::vector<std::string>& writable_uuids() const = 0;
  // Peer allocations mapped so far whose size is not a multiple of 64 KiB:
  // the copy engines write them ~25 % slower (docs/gpu.md).
  virtual int64_t slow_peer_mappings() const = 0;

  // Data ops on this device (one per transfer channel).
  virtual absl::StatusOr<std::unique_ptr<exec::DataOps>> NewDataOps() = 0;

  // An NCCL communicator of `size` ranks: rank 0 publishes the unique id under
  // `prefix` in `store`; every rank must join before `deadline`. `cancel`
  // (not owned, may be null) ends the setup, and later rounds, with CANCELLED
  // once it turns true.
  virtual absl::StatusOr<std::unique_ptr<transport::Transport>> Connect(
      transport::KvStore& store, const std::string& prefix, int32_t rank, int32_t size,
      absl::Time deadline, const std::atomic<bool>* cancel) = 0;
};

// UNIMPLEMENTED in builds without WSYNC_WITH_CUDA; FAILED_PRECONDITION when
// the device does not exist.
absl::StatusOr<std::unique_ptr<GpuPlane>> CreateGpuPlane(int device);

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_GPU_PLANE_H_
