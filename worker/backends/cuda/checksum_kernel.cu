#include "common/chunk_hash.h"
#include "worker/backends/cuda/checksum_kernel.h"

namespace wsync::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ChunkHashSumKernel(const unsigned char* data, int64_t bytes, int64_t chunks,
                                   unsigned long long* sum) {
  __shared__ unsigned long long partial[kThreads];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  unsigned long long term = 0;
  if (c < chunks) {
    const int64_t off = c * chunk_hash::kChunkBytes;
    const int64_t n = bytes - off < chunk_hash::kChunkBytes ? bytes - off : chunk_hash::kChunkBytes;
    term = chunk_hash::ChunkTerm(chunk_hash::ChunkHash(data + off, n, c), c);
  }
  partial[threadIdx.x] = term;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sum, partial[0]);  // mod 2^64, as on the host
}

}  // namespace

cudaError_t LaunchChunkHashSum(const void* data, int64_t bytes, unsigned long long* sum,
                               cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  const int64_t chunks = (bytes + chunk_hash::kChunkBytes - 1) / chunk_hash::kChunkBytes;
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  ChunkHashSumKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(data), bytes, chunks, sum);
  return cudaGetLastError();
}

}  // namespace wsync::cuda
