#include "worker/backends/cuda/staging_pool.h"

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"

namespace wsync::cuda {

StagingPool::~StagingPool() {
  DeviceGuard guard(device_);
  for (auto& [ptr, block] : blocks_) cudaFree(ptr);
}

absl::StatusOr<void*> StagingPool::Get(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  void* best = nullptr;
  int64_t best_size = 0;
  for (auto& [ptr, block] : blocks_) {
    // Smallest free block that fits without wasting more than its request.
    if (!block.in_use && block.size >= bytes && block.size <= 2 * bytes + (int64_t{2} << 20) &&
        (best == nullptr || block.size < best_size)) {
      best = ptr;
      best_size = block.size;
    }
  }
  if (best != nullptr) {
    blocks_[best].in_use = true;
    return best;
  }
  constexpr int64_t kGranule = int64_t{2} << 20;
  const int64_t size = (bytes + kGranule - 1) / kGranule * kGranule;
  DeviceGuard guard(device_);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, static_cast<size_t>(size));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free allocation error
    TrimLocked();
    err = cudaMalloc(&p, static_cast<size_t>(size));
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err,
                      absl::StrCat("staging allocation of ", bytes, " bytes on device ", device_));
  }
  blocks_[p] = Block{size, true};
  return p;
}

void StagingPool::Put(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(p);
  if (it != blocks_.end()) it->second.in_use = false;
}

void StagingPool::TrimLocked() {
  DeviceGuard guard(device_);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (!it->second.in_use) {
      cudaFree(it->first);
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace wsync::cuda
