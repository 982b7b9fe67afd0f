// Zero-copy access to tensors that live in another process (vLLM's weights,
// the trainer's parameters) through legacy CUDA IPC.
//
// The owner exports each tensor as (IPC handle of its allocation base, base
// size, offset, bytes, GPU UUID): caching allocators hand out sub-ranges of
// big cudaMalloc blocks, and only a block's base can be exported. The
// importer opens every base once, however many tensors live in it, checks
// each tensor's range against the mapped size, and refuses handles from a
// GPU other than its own (compared by UUID: device ordinals differ between
// processes with different CUDA_VISIBLE_DEVICES).
//
// Memory from the virtual memory API (cuMemCreate: PyTorch with
// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, vLLM sleep mode's
// CuMemAllocator) cannot be exported this way; export refuses it with an
// error naming those settings (POSIX fd handles over SCM_RIGHTS would be
// needed; see docs/gpu.md). Legacy handles also cannot be opened across PID
// namespaces: a Kubernetes sidecar needs shareProcessNamespace or hostPID.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_IPC_REGISTRY_H_
#define WSYNC_WORKER_BACKENDS_CUDA_IPC_REGISTRY_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace wsync::cuda {

struct IpcTensorHandle {
  std::string gpu_uuid;     // "GPU-..." of the owning device
  std::string base_handle;  // cudaIpcMemHandle_t bytes of the allocation base
  uint64_t base_bytes = 0;  // size of that allocation
  uint64_t offset = 0;      // tensor start inside the allocation
  uint64_t bytes = 0;       // tensor size

  // Fixed-layout text form ("uuid:hex(handle):base_bytes:offset:bytes").
  std::string Serialize() const;
  static absl::StatusOr<IpcTensorHandle> Parse(const std::string& text);
};

// Owner side: describes the device tensor [ptr, ptr + bytes) for export.
// FAILED_PRECONDITION for cuMem (expandable segments / sleep mode) memory,
// INVALID_ARGUMENT for host or managed memory or a range past its allocation.
absl::StatusOr<IpcTensorHandle> ExportTensor(const void* ptr, uint64_t bytes,
                                             const std::string& name);

// UUIDs of the GPUs `device` can write into: itself and every GPU this
// process sees with peer access from it (NVLink or PCIe).
absl::StatusOr<std::vector<std::string>> WritableDeviceUuids(int device);

// True when copy-engine writes into a peer's allocation of this size are
// slow: its size is not a multiple of 64 KiB (docs/direct-writes.md, "Peer
// allocations should be multiples of 64 KiB").
inline bool SlowForPeerWrites(uint64_t allocation_bytes) {
  return allocation_bytes % (uint64_t{64} << 10) != 0;
}

// Importer side, for one device of this process. Thread-safe.
class IpcRegistry {
 public:
  static absl::StatusOr<std::unique_ptr<IpcRegistry>> Create(int device);
  ~IpcRegistry();
  IpcRegistry(const IpcRegistry&) = delete;
  IpcRegistry& operator=(const IpcRegistry&) = delete;

  // Device pointer to the tensor in this process. `name` is used in errors.
  // Each successful Open holds its allocation's mapping until a matching
  // Release(handle). `peer`: the tensor may also live on another GPU that
  // this device writes over peer access (a peer worker's buffer for direct
  // writes); the pointer is then usable by this device's kernels and copies.
  absl::StatusOr<void*> Open(const IpcTensorHandle& handle, const std::string& name,
                             bool peer = false);
  // Drops one Open's hold; the last one unmaps the allocation, so an owner
  // that re-registers from new memory can free the old (an importer keeping
  // it open would leak it, and freeing mapped memory is undefined behaviour).
  void Release(const IpcTensorHandle& handle);

  int device() const { return device_; }
  const std::string& uuid() const { return uuid_; }
  const std::vector<std::string>& writable_uuids() const { return writable_uuids_; }
  // Number of allocation bases mapped (each opened once).
  size_t num_mappings() const;
  // Peer allocations mapped so far whose size SlowForPeerWrites (each is
  // also logged once, with the tensor that opened it).
  int64_t slow_peer_mappings() const;

 private:
  struct Mapping {
    void* base = nullptr;
    uint64_t bytes = 0;
    int64_t holds = 0;
  };
  IpcRegistry() = default;

  int device_ = 0;
  std::string uuid_;
  std::vector<std::string> writable_uuids_;  // WritableDeviceUuids(device_)
  mutable std::mutex mu_;
  std::map<std::string, Mapping> mappings_;  // by handle bytes
  int64_t slow_peer_mappings_ = 0;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_IPC_REGISTRY_H_
