#ifndef WSYNC_WORKER_BACKENDS_CUDA_STAGING_POOL_H_
#define WSYNC_WORKER_BACKENDS_CUDA_STAGING_POOL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "absl/status/statusor.h"

namespace wsync::cuda {

// Staging memory for one device. Buffers go back to the pool, not the driver:
// cudaMalloc/cudaFree of gigabytes per round would cost milliseconds and
// synchronize the device. Shared with the StagingBuffers' free functions so a
// buffer may outlive its CudaDataOps.
class StagingPool {
 public:
  explicit StagingPool(int device) : device_(device) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least `bytes`: the smallest free one that fits without
  // wasting more than the request, else a new cudaMalloc (after returning the
  // free ones to the driver if memory is short). Errors (RESOURCE_EXHAUSTED
  // when memory is short) name the size and the device.
  absl::StatusOr<void*> Get(int64_t bytes);
  // Marks a buffer from Get free again.
  void Put(void* p);

 private:
  struct Block {
    int64_t size = 0;
    bool in_use = false;
  };
  void TrimLocked();

  const int device_;
  std::mutex mu_;
  std::map<void*, Block> blocks_;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_STAGING_POOL_H_
