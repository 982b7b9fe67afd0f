// The one batched kernel behind CudaDataOps: every task of a piece table in
// one launch (warps claim parts of tasks from a counter, 16-byte vector
// copies where rows are aligned, fp32 / bf16 / fp16 conversions, reductions).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_PIECE_KERNELS_H_
#define WSYNC_WORKER_BACKENDS_CUDA_PIECE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/backends/cuda/piece_desc.h"

namespace wsync::cuda {

// All pointers are device pointers. `copy_only`: every piece is a plain copy
// (kModeVecCopy / kModeRawCopy), which runs a leaner instantiation.
// `max_blocks` caps the grid (a few blocks per SM saturate HBM). Returns the
// launch error, if any.
// Warps claim parts of tasks in order from *next_task (zero at launch), so
// blocks that start late, once a kernel beside this one frees its SM slots,
// still share the work instead of each owning a fixed slice. Blocks on SMs
// [0, reserved_sms) do nothing, so that a small kernel launched just before
// on another stream always finds an SM.
cudaError_t LaunchPieceKernel(const PieceDesc* pieces, const TaskDesc* tasks, int64_t num_tasks,
                              const uint64_t* inputs, unsigned long long* next_task, bool copy_only,
                              int max_blocks, int reserved_sms, cudaStream_t stream);

// How many blocks of the instantiation fit on one SM at once (its register
// use decides). Blocks beyond that only wait for a free slot.
cudaError_t PieceKernelResidentBlocks(bool copy_only, int* blocks_per_sm);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_PIECE_KERNELS_H_
