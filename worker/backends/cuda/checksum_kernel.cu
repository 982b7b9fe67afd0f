#include "common/chunk_hash.h"
#include "worker/backends/cuda/checksum_kernel.h"

namespace wsync::cuda {
namespace {

constexpr int kThreads = 256;

__device__ uint64_t LoadWord(const unsigned char* data, int64_t k, bool aligned) {
  if (aligned) return reinterpret_cast<const uint64_t*>(data)[k];
  return chunk_hash::TailWord(data + 8 * k, 8);
}

__global__ void WordHashSumKernel(const unsigned char* data, int64_t bytes, bool aligned,
                                  unsigned long long* sum) {
  const int64_t words = bytes / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  uint64_t acc = 0;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < words;
       k += stride) {
    acc += chunk_hash::Term(LoadWord(data, k, aligned), k);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && bytes % 8 != 0) {
    acc += chunk_hash::Term(chunk_hash::TailWord(data + 8 * words, bytes % 8), words);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  __shared__ uint64_t warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t block = 0;
    for (int w = 0; w < kThreads / 32; ++w) block += warp_sums[w];
    atomicAdd(sum, static_cast<unsigned long long>(block));
  }
}

}  // namespace

cudaError_t LaunchChunkHashSum(const void* data, int64_t bytes, unsigned long long* sum,
                               cudaStream_t stream, int max_blocks) {
  if (bytes <= 0) return cudaSuccess;
  const int64_t words = bytes / 8 + 1;
  int64_t blocks = (words + kThreads - 1) / kThreads;
  if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 8 == 0;
  WordHashSumKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(data), bytes, aligned, sum);
  return cudaGetLastError();
}

}  // namespace wsync::cuda
