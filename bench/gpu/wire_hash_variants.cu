#include "bench/gpu/wire_hash_variants.h"
#include "common/chunk_hash.h"

namespace wsync::bench {
namespace {

constexpr int kThreads = 256;

__global__ void Session18InteriorKernel(cuda::WireHashDeviceTable t, unsigned long long* sum) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  uint64_t acc = 0;
  int64_t item = 0;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < t.interior_words;
       g += stride) {
    if (g >= t.interior_before[item + 1] || g < t.interior_before[item]) {
      int64_t lo = 0, hi = t.num_items - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (t.interior_before[mid + 1] > g) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      item = lo;
    }
    const int64_t k = t.first_word[item] + (g - t.interior_before[item]);
    const cuda::WireHashDesc& d = t.items[item];
    const unsigned char* p = d.data + (8 * k - d.offset);
    uint64_t w = 0;
    if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
      w = *reinterpret_cast<const uint64_t*>(p);
    } else {
      for (int b = 0; b < 8; ++b) w |= static_cast<uint64_t>(p[b]) << (8 * b);
    }
    acc += chunk_hash::Term(w, k);
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

cudaError_t LaunchSession18WireHashSum(const cuda::WireHashDeviceTable& table, int64_t bucket_bytes,
                                       unsigned long long* sum, cudaStream_t stream,
                                       int max_blocks) {
  if (table.interior_words > 0 && table.num_items > 0) {
    int64_t blocks = (table.interior_words + kThreads - 1) / kThreads;
    if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
    Session18InteriorKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(table, sum);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  cuda::WireHashDeviceTable boundary = table;
  boundary.interior_words = 0;
  return cuda::LaunchWireHashSum(boundary, bucket_bytes, sum, stream, max_blocks);
}

}  // namespace wsync::bench
