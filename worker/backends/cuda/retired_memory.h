// Device and pinned memory a data-op call no longer needs, freed later, at a
// point the caller chooses. cudaFree and cudaFreeHost wait for the whole
// device, NCCL's kernels included: a call issued while a transfer is in
// flight (the executor issues overlapping work from Transport::RunRound's
// on_posted) must not free, or a kernel waiting on a dead peer would hold it
// past every deadline, where no watchdog can reach it.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_RETIRED_MEMORY_H_
#define WSYNC_WORKER_BACKENDS_CUDA_RETIRED_MEMORY_H_

#include <utility>
#include <vector>

#include "worker/backends/cuda/cuda_handles.h"

namespace wsync::cuda {

class RetiredMemory {
 public:
  void Retire(DeviceBuffer&& b) {
    if (b.size() > 0) device_.push_back(std::move(b));
  }
  void Retire(PinnedBuffer&& b) {
    if (b.size() > 0) pinned_.push_back(std::move(b));
  }
  // Frees everything retired. The caller knows nothing still reads it and no
  // transfer is in flight.
  void Release() {
    device_.clear();
    pinned_.clear();
  }
  size_t buffers() const { return device_.size() + pinned_.size(); }

 private:
  std::vector<DeviceBuffer> device_;
  std::vector<PinnedBuffer> pinned_;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_RETIRED_MEMORY_H_
