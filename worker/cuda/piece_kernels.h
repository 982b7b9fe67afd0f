// The one batched kernel behind CudaDataOps: every task of a piece table in
// one launch (grid-stride over tasks, a warp per row segment, 16-byte vector
// copies where rows are aligned, fp32 / bf16 / fp16 conversions, reductions).
#ifndef WSYNC_WORKER_CUDA_PIECE_KERNELS_H_
#define WSYNC_WORKER_CUDA_PIECE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/cuda/piece_desc.h"

namespace wsync::cuda {

// All pointers are device pointers. `max_blocks` caps the grid (a few blocks
// per SM saturate HBM). Returns the launch error, if any.
cudaError_t LaunchPieceKernel(const PieceDesc* pieces, const TaskDesc* tasks, int64_t num_tasks,
                              const uint64_t* inputs, int max_blocks, cudaStream_t stream);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_CUDA_PIECE_KERNELS_H_
