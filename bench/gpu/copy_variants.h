// Copy-only configurations of the piece kernel (warp item size, parts per
// task, blocks per SM), run on an uploaded table, to measure against the
// production one (worker/backends/cuda/piece_kernels.cu).
#ifndef WSYNC_BENCH_GPU_COPY_VARIANTS_H_
#define WSYNC_BENCH_GPU_COPY_VARIANTS_H_

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "worker/backends/cuda/batched_kernels.h"

namespace wsync::bench {

struct CopyVariant {
  std::string name;  // v_l<units per lane>p<parts per task>b<min blocks per SM>
  // Launches on `table` (a device copy of a TableLayout-serialized table) with
  // at most blocks_per_sm blocks per SM (fewer if fewer fit).
  cudaError_t (*run)(const void* table, const cuda::TableLayout& layout, int blocks_per_sm, int sms,
                     cudaStream_t stream);
};

const std::vector<CopyVariant>& CopyVariants();

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_COPY_VARIANTS_H_
