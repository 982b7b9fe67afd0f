#include "worker/backends/cuda/block_fp8_kernel.h"

#include "worker/backends/cuda/piece_kernel_impl.cuh"

namespace wsync::cuda {
namespace {

constexpr int kThreads = 256;

using piece_impl::RoundShift;

// common/cast.cc FloatToFp8E4M3: round to nearest even, saturate to +-448,
// NaN -> sign | 0x7f.
__device__ uint8_t ToE4M3(float f) {
  const uint32_t bits = __float_as_uint(f);
  const uint32_t sign_out = (bits >> 31) << 7;
  const uint32_t exp8 = (bits >> 23) & 0xFF;
  const uint32_t man = bits & 0x7FFFFF;
  constexpr uint32_t kMax = 0x7E;
  if (exp8 == 0xFF) return static_cast<uint8_t>(sign_out | (man != 0 ? 0x7F : kMax));
  constexpr int emin = -6;  // 1 - bias
  const int ex = exp8 == 0 ? -126 : static_cast<int>(exp8) - 127;
  uint64_t r;
  if (exp8 != 0 && ex >= emin) {
    r = RoundShift((static_cast<uint64_t>(ex - emin + 1) << 23) | man, 20);
  } else {
    const uint64_t full = exp8 == 0 ? man : (man | 0x800000u);
    r = RoundShift(full, 20 + (emin - ex));
  }
  if (r > kMax) r = kMax;
  return static_cast<uint8_t>(sign_out | static_cast<uint32_t>(r));
}

// max where a NaN sticks (the host reference's amax).
__device__ __forceinline__ float MaxNan(float a, float b) {
  return a != a ? a : ((b != b || b > a) ? b : a);
}

__global__ void __launch_bounds__(kThreads)
    BlockFp8Kernel(const QuantRegionDesc* regions, int32_t num_regions, int64_t total_blocks) {
  __shared__ float warp_max[kThreads / 32];
  __shared__ float scale_sh;
  for (int64_t blk = blockIdx.x; blk < total_blocks; blk += gridDim.x) {
    int32_t lo = 0, hi = num_regions - 1;
    while (lo < hi) {  // last region with block_begin <= blk
      const int32_t mid = (lo + hi + 1) / 2;
      if (regions[mid].block_begin <= blk) lo = mid; else hi = mid - 1;
    }
    const QuantRegionDesc& q = regions[lo];
    const int64_t rb = (q.rows + q.block_rows - 1) / q.block_rows;
    const int64_t cb = (q.cols + q.block_cols - 1) / q.block_cols;
    int64_t local = blk - q.block_begin;
    const int64_t bj = local % cb;
    local /= cb;
    const int64_t bi = local % rb;
    const int64_t o = local / rb;
    const int64_t r0 = bi * q.block_rows, c0 = bj * q.block_cols;
    const int64_t nr = min(q.block_rows, q.rows - r0), nc = min(q.block_cols, q.cols - c0);
    const float* src = reinterpret_cast<const float*>(q.src) + o * q.rows * q.cols;
    float m = 0.0f;
    for (int64_t k = threadIdx.x; k < nr * nc; k += kThreads) {
      m = MaxNan(m, fabsf(src[(r0 + k / nc) * q.cols + c0 + k % nc]));
    }
    for (int s = 16; s > 0; s /= 2) m = MaxNan(m, __shfl_xor_sync(0xffffffffu, m, s));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    // Leading-dim offsets of this matrix.
    int64_t dlead = 0, slead = 0, rem = o;
    for (int k = q.nlead - 1; k >= 0; --k) {
      const int64_t idx = rem % q.lead_shape[k];
      rem /= q.lead_shape[k];
      dlead += idx * q.dst_lead_stride[k];
      slead += idx * q.scale_lead_stride[k];
    }
    if (threadIdx.x == 0) {
      float a = warp_max[0];
      for (int w = 1; w < kThreads / 32; ++w) a = MaxNan(a, warp_max[w]);
      const float scale = a == 0.0f ? 1.0f : __fdiv_rn(a, 448.0f);
      scale_sh = scale;
      // Scales may sit unaligned in staging: store bytewise.
      char* sp = reinterpret_cast<char*>(q.scale) +
                 4 * (slead + bi * q.scale_row_stride + bj * q.scale_col_stride);
      const uint32_t b = __float_as_uint(scale);
      for (int k = 0; k < 4; ++k) sp[k] = static_cast<char>((b >> (8 * k)) & 0xFF);
    }
    __syncthreads();
    const float scale = scale_sh;
    uint8_t* dst = reinterpret_cast<uint8_t*>(q.dst) + dlead;
    for (int64_t k = threadIdx.x; k < nr * nc; k += kThreads) {
      const int64_t r = r0 + k / nc, c = c0 + k % nc;
      dst[r * q.dst_row_stride + c * q.dst_col_stride] = ToE4M3(__fdiv_rn(src[r * q.cols + c], scale));
    }
    __syncthreads();  // warp_max / scale_sh are reused by the next block
  }
}

}  // namespace

cudaError_t LaunchBlockFp8Quantize(const QuantRegionDesc* regions, int32_t num_regions,
                                   int64_t total_blocks, cudaStream_t stream) {
  if (total_blocks <= 0 || num_regions <= 0) return cudaSuccess;
  const int64_t grid = total_blocks < 65535 * 16 ? total_blocks : 65535 * 16;
  BlockFp8Kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(regions, num_regions,
                                                                       total_blocks);
  return cudaGetLastError();
}

}  // namespace wsync::cuda
