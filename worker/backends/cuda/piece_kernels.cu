#include "worker/backends/cuda/piece_kernels.h"

#include "worker/backends/cuda/piece_kernel_impl.cuh"

namespace wsync::cuda {
namespace {

using piece_impl::PieceKernel;
constexpr int kThreads = piece_impl::kThreads;
// The copy-only kernel is held to 80 registers so that 3 blocks fit on an SM
// (nothing spills); unbounded it takes 128 and only 2 fit. On H200 the
// colocated Qwen3-30B-A3B sync with direct writes took 20.0 ms at 3 blocks
// against 23.9 ms at 2 and 25.8 ms at 4 (64 registers, more spills).
constexpr int kCopyOnlyMinBlocks = 3;
// The full kernel (casts, reductions) at 128 registers: 2 blocks fit.
constexpr int kFullMinBlocks = 2;

}  // namespace

cudaError_t LaunchPieceKernel(const PieceDesc* pieces, const TaskDesc* tasks, int64_t num_tasks,
                              const uint64_t* inputs, unsigned long long* next_task, bool copy_only,
                              int max_blocks, int reserved_sms, cudaStream_t stream) {
  if (num_tasks <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(num_tasks < max_blocks ? num_tasks : max_blocks);
  if (copy_only) {
    PieceKernel<true, kCopyOnlyMinBlocks><<<blocks, kThreads, 0, stream>>>(
        pieces, tasks, num_tasks, inputs, next_task, static_cast<unsigned>(reserved_sms));
  } else {
    PieceKernel<false, kFullMinBlocks><<<blocks, kThreads, 0, stream>>>(
        pieces, tasks, num_tasks, inputs, next_task, static_cast<unsigned>(reserved_sms));
  }
  return cudaGetLastError();
}

cudaError_t PieceKernelResidentBlocks(bool copy_only, int* blocks_per_sm) {
  return copy_only ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         blocks_per_sm, PieceKernel<true, kCopyOnlyMinBlocks>, kThreads, 0)
                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         blocks_per_sm, PieceKernel<false, kFullMinBlocks>, kThreads, 0);
}

}  // namespace wsync::cuda
