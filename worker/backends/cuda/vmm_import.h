// Device memory of another process that it allocated with the CUDA virtual
// memory API (cuMemCreate; PyTorch's expandable segments) and exported as
// POSIX file descriptors (CudaVmm in worker_local.proto). The owner's tensor
// may span several physical allocations ("chunks") mapped back to back; the
// importer reserves one address range, maps the chunks into it in order and
// grants this device read/write access, so the range reads as the owner's
// does. The mapping keeps the physical memory alive until it is destroyed,
// even if the owner frees it.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_VMM_IMPORT_H_
#define WSYNC_WORKER_BACKENDS_CUDA_VMM_IMPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/plane/fd_batch.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::cuda {

class VmmMapping {
 public:
  // Maps `vmm`'s chunks (descriptors from `fds`) for `device`. Errors start
  // with `what`: INVALID_ARGUMENT for a chunk list that names a descriptor
  // outside the batch, a size that is not a positive multiple of the
  // allocation granularity, or a tensor range outside the chunks (all sizes
  // overflow-checked); the driver's error, with the chunk, when importing or
  // mapping fails (e.g. a descriptor that is no CUDA allocation).
  static absl::StatusOr<std::shared_ptr<VmmMapping>> Map(int device, const v1::CudaVmm& vmm,
                                                         const plane::FdBatch& fds,
                                                         const std::string& what);
  ~VmmMapping();
  VmmMapping(const VmmMapping&) = delete;
  VmmMapping& operator=(const VmmMapping&) = delete;

  // The first byte of the chunks' range in this process, and its size.
  void* base() const { return reinterpret_cast<void*>(base_); }
  uint64_t bytes() const { return reserved_; }

 private:
  VmmMapping(int device, uint64_t base, uint64_t reserved)
      : device_(device), base_(base), reserved_(reserved) {}
  absl::Status MapChunks(const v1::CudaVmm& vmm, const plane::FdBatch& fds,
                         const std::string& what);

  const int device_;
  const uint64_t base_;
  const uint64_t reserved_;
  std::vector<uint64_t> mapped_;  // sizes of the chunks mapped from base_, in order
};

// The sum of the chunks' sizes after the checks Map makes (for tests and
// for the caller's range check).
absl::StatusOr<uint64_t> VmmRangeBytes(const v1::CudaVmm& vmm, const plane::FdBatch& fds,
                                       uint64_t granularity, const std::string& what);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_VMM_IMPORT_H_
