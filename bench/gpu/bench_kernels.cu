#include "bench/gpu/bench_kernels.h"

namespace wsync::bench {
namespace {

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillStridedKernel(uint16_t* p, int64_t rows, int64_t cols, int64_t row_stride,
                                  uint64_t seed) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint16_t v = static_cast<uint16_t>(Mix(seed * 0x100000001B3ull + i));
    p[(i / cols) * row_stride + i % cols] = v == 0 ? 1 : v;
  }
}

__global__ void ChecksumStridedKernel(const uint16_t* p, int64_t rows, int64_t cols,
                                      int64_t row_stride, unsigned long long* sum) {
  const int64_t n = rows * cols;
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint16_t v = p[(i / cols) * row_stride + i % cols];
    if (v != 0) local += Mix(v);
  }
  for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, local);
}

// 32-bit elements (fp32) whose upper half is a finite bf16 pattern and whose
// lower half is zero: a cast to bf16 is exact, so a bf16 destination's
// checksum equals the source's (ChecksumUpper16StridedKernel).
__global__ void Fill32StridedKernel(uint32_t* p, int64_t rows, int64_t cols, int64_t row_stride,
                                    uint64_t seed) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint16_t v = static_cast<uint16_t>(Mix(seed * 0x100000001B3ull + i));
    if ((v & 0x7F80u) == 0x7F80u) v ^= 0x4000u;  // no Inf / NaN
    p[(i / cols) * row_stride + i % cols] = uint32_t{v == 0 ? 1u : v} << 16;
  }
}

__global__ void ChecksumUpper16StridedKernel(const uint32_t* p, int64_t rows, int64_t cols,
                                             int64_t row_stride, unsigned long long* sum) {
  const int64_t n = rows * cols;
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint16_t v = static_cast<uint16_t>(p[(i / cols) * row_stride + i % cols] >> 16);
    if (v != 0) local += Mix(v);
  }
  for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, local);
}

__global__ void CopySimpleKernel(int4* __restrict__ d, const int4* __restrict__ s, int64_t n) {
  constexpr int kUnroll = 4;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    int4 v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = s[i + k * stride];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) d[i + k * stride] = v[k];
  }
  for (; i < n; i += stride) d[i] = s[i];
}

}  // namespace

cudaError_t CopySimple(void* dst, const void* src, int64_t bytes, int grid, cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  CopySimpleKernel<<<grid, 256, 0, stream>>>(static_cast<int4*>(dst), static_cast<const int4*>(src),
                                             bytes / 16);
  return cudaGetLastError();
}

cudaError_t Fill16Strided(void* p, int64_t rows, int64_t cols, int64_t row_stride, uint64_t seed,
                          cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  FillStridedKernel<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(p), rows, cols, row_stride,
                                              seed);
  return cudaGetLastError();
}

cudaError_t Checksum16Strided(const void* p, int64_t rows, int64_t cols, int64_t row_stride,
                              unsigned long long* sum, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  ChecksumStridedKernel<<<1024, 256, 0, stream>>>(static_cast<const uint16_t*>(p), rows, cols,
                                                  row_stride, sum);
  return cudaGetLastError();
}

cudaError_t Fill32Strided(void* p, int64_t rows, int64_t cols, int64_t row_stride, uint64_t seed,
                          cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  Fill32StridedKernel<<<1024, 256, 0, stream>>>(static_cast<uint32_t*>(p), rows, cols, row_stride,
                                                seed);
  return cudaGetLastError();
}

cudaError_t ChecksumUpper16Strided(const void* p, int64_t rows, int64_t cols, int64_t row_stride,
                                   unsigned long long* sum, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  ChecksumUpper16StridedKernel<<<1024, 256, 0, stream>>>(static_cast<const uint32_t*>(p), rows,
                                                         cols, row_stride, sum);
  return cudaGetLastError();
}

}  // namespace wsync::bench
