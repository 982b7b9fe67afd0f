#include <algorithm>
#include <set>
#include <utility>

#include "common/chunk_hash.h"
#include "worker/backends/cuda/piece_kernel_impl.cuh"
#include "worker/backends/cuda/wire_hash_kernel.h"

namespace wsync::cuda {
namespace {

constexpr int kThreads = 256;
using piece_impl::LoadBits;
using piece_impl::NarrowCode;

// The element at flat row-major index e, its bytes as a little-endian code.
__device__ uint64_t RawElement(const unsigned char* p, int size) {
  uint64_t v = 0;
  for (int b = 0; b < size; ++b) v |= static_cast<uint64_t>(p[b]) << (8 * b);
  return v;
}

__device__ const unsigned char* ElementAddress(const WireHashDesc& d, int64_t e) {
  int64_t off = 0;
  for (int k = d.ndim - 1; k >= 0; --k) {
    const int64_t n = d.shape[k] > 0 ? d.shape[k] : 1;
    off += (e % n) * d.strides[k];
    e /= n;
  }
  return d.data + off * d.src_size;
}

// Element e of item d in the wire dtype (common/cast.h: a conversion between
// equal dtypes is a copy, any other rounds once through fp32).
__device__ uint64_t WireElement(const WireHashDesc& d, int64_t e) {
  const unsigned char* p = ElementAddress(d, e);
  if (d.src_dtype == d.via_dtype && d.via_dtype == d.wire_dtype) return RawElement(p, d.src_size);
  uint32_t bits = LoadBits(reinterpret_cast<const char*>(p), d.src_dtype);  // fp32 bits
  if (d.via_dtype != d.src_dtype) {
    const uint32_t code = NarrowCode(bits, d.via_dtype);
    if (d.wire_dtype == d.via_dtype) return code;
    alignas(4) unsigned char tmp[4];
    for (int b = 0; b < 4; ++b) tmp[b] = static_cast<unsigned char>(code >> (8 * b));
    bits = LoadBits(reinterpret_cast<const char*>(tmp), d.via_dtype);
  }
  return NarrowCode(bits, d.wire_dtype);
}

// Word k (absolute in the bucket) of item d, wholly inside it.
__device__ uint64_t InteriorWord(const WireHashDesc& d, int64_t k) {
  const int64_t rel = 8 * k - d.offset;
  if (d.raw) {
    const unsigned char* p = d.data + rel;
    if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
    return RawElement(p, 8);
  }
  uint64_t w = 0;
  if (rel % d.wire_size != 0) {
    // An item at a bucket offset that is not a multiple of its element size:
    // the word's bytes straddle elements, so it is put together byte by byte.
    for (int b = 0; b < 8; ++b) {
      const int64_t pos = rel + b;
      const uint64_t code = WireElement(d, pos / d.wire_size);
      w |= ((code >> (8 * (pos % d.wire_size))) & 0xFF) << (8 * b);
    }
    return w;
  }
  const int per = 8 / d.wire_size;
  const int64_t e0 = rel / d.wire_size;
  for (int j = 0; j < per; ++j) {
    w |= WireElement(d, e0 + j) << (8 * d.wire_size * j);
  }
  return w;
}

__device__ void AddBlockSum(uint64_t acc, unsigned long long* sum) {
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

// The item whose interior range holds interior word g (the first whose
// range ends past g: items with no interior word have empty ranges).
__device__ int64_t ItemOf(const WireHashDeviceTable& t, int64_t g) {
  int64_t lo = 0, hi = t.num_items - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (t.interior_before[mid + 1] > g) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Interior words are taken a chunk at a time, one block per chunk: the
// block finds the chunk's item once; a chunk wholly inside a raw item is
// read with every thread's loads issued before any term is computed
// (kWordsPerThread words in flight per thread, 16-byte loads where aligned,
// streamed past L2's working set), so the kernel runs at HBM speed rather
// than at one dependent 8-byte load per thread (session 18's kernel).
constexpr int kWordsPerThread = 8;
constexpr int64_t kChunkWords = int64_t{kThreads} * kWordsPerThread;

__device__ uint64_t RawChunkTerms(const unsigned char* p, int64_t k0) {
  uint64_t acc = 0;
  const int64_t t = threadIdx.x;
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    const auto* q = reinterpret_cast<const ulonglong2*>(p);
    ulonglong2 v[kWordsPerThread / 2];
#pragma unroll
    for (int j = 0; j < kWordsPerThread / 2; ++j) v[j] = __ldcs(q + j * kThreads + t);
#pragma unroll
    for (int j = 0; j < kWordsPerThread / 2; ++j) {
      const int64_t k = k0 + 2 * (j * kThreads + t);
      acc += chunk_hash::Term(v[j].x, k) + chunk_hash::Term(v[j].y, k + 1);
    }
    return acc;
  }
  const auto* q = reinterpret_cast<const unsigned long long*>(p);
  uint64_t w[kWordsPerThread];
#pragma unroll
  for (int j = 0; j < kWordsPerThread; ++j) w[j] = __ldcs(q + j * kThreads + t);
#pragma unroll
  for (int j = 0; j < kWordsPerThread; ++j) acc += chunk_hash::Term(w[j], k0 + j * kThreads + t);
  return acc;
}

__global__ void InteriorKernel(WireHashDeviceTable t, unsigned long long* sum) {
  uint64_t acc = 0;
  const int64_t chunks = (t.interior_words + kChunkWords - 1) / kChunkWords;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t g0 = c * kChunkWords;
    const int64_t g1 = g0 + kChunkWords < t.interior_words ? g0 + kChunkWords : t.interior_words;
    int64_t item = ItemOf(t, g0);  // the same for every thread of the block
    const WireHashDesc& d = t.items[item];
    if (d.raw && g1 - g0 == kChunkWords && g1 <= t.interior_before[item + 1]) {
      const int64_t k0 = t.first_word[item] + (g0 - t.interior_before[item]);
      const unsigned char* p = d.data + (8 * k0 - d.offset);
      if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
        acc += RawChunkTerms(p, k0);
        continue;
      }
    }
    // Anything else (a chunk across items, the last one, an unaligned or
    // converted item): word by word, the item looked up where a word leaves it.
    for (int64_t g = g0 + threadIdx.x; g < g1; g += kThreads) {
      if (g >= t.interior_before[item + 1]) item = ItemOf(t, g);
      const int64_t k = t.first_word[item] + (g - t.interior_before[item]);
      acc += chunk_hash::Term(InteriorWord(t.items[item], k), k);
    }
  }
  AddBlockSum(acc, sum);
}

__global__ void BoundaryKernel(WireHashDeviceTable t, int64_t bucket_bytes,
                               unsigned long long* sum) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= t.num_boundary) return;
  const int64_t k = t.boundary_words[i];
  uint64_t w = 0;
  for (int b = 0; b < 8; ++b) {
    const int64_t pos = 8 * k + b;
    if (pos >= bucket_bytes) break;
    // The last item starting at or before pos.
    int64_t lo = 0, hi = t.num_items - 1, found = -1;
    while (lo <= hi) {
      const int64_t mid = (lo + hi) / 2;
      if (t.items[mid].offset <= pos) {
        found = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (found < 0) continue;
    const WireHashDesc& d = t.items[found];
    const int64_t rel = pos - d.offset;
    if (rel >= d.bytes) continue;  // a gap
    const uint64_t code = WireElement(d, rel / d.wire_size);
    w |= ((code >> (8 * (rel % d.wire_size))) & 0xFF) << (8 * b);
  }
  atomicAdd(sum, static_cast<unsigned long long>(chunk_hash::Term(w, k)));
}

}  // namespace

WireHashTable BuildWireHashTable(std::vector<WireHashDesc> items, int64_t bucket_bytes) {
  WireHashTable t;
  t.items = std::move(items);
  t.interior_before.push_back(0);
  std::set<int64_t> boundary;
  const int64_t words = (bucket_bytes + 7) / 8;
  // The words wholly inside the gap [a, b): no item byte, so their terms
  // are constants (a partial last word counts to the bucket's end).
  auto zero_words = [&](int64_t a, int64_t b) {
    for (int64_t k = (a + 7) / 8; k < words && std::min(8 * k + 8, bucket_bytes) <= b; ++k) {
      t.zero_sum += chunk_hash::Term(0, k);
    }
  };
  int64_t covered_to = 0;
  for (const WireHashDesc& d : t.items) {
    zero_words(covered_to, d.offset);
    const int64_t end = d.offset + d.bytes;
    const int64_t first = (d.offset + 7) / 8;  // the first word starting inside it
    const int64_t last = end / 8;              // the words before it end inside it
    t.first_word.push_back(first);
    t.interior_before.push_back(t.interior_before.back() + std::max<int64_t>(0, last - first));
    // Words it shares with a gap, another item or the bucket's end.
    if (d.bytes > 0 && d.offset % 8 != 0) boundary.insert(d.offset / 8);
    if (d.bytes > 0 && end % 8 != 0) boundary.insert(end / 8);
    covered_to = std::max(covered_to, end);
  }
  zero_words(covered_to, bucket_bytes);
  t.boundary_words.assign(boundary.begin(), boundary.end());
  return t;
}

cudaError_t LaunchWireHashSum(const WireHashDeviceTable& table, int64_t bucket_bytes,
                              unsigned long long* sum, cudaStream_t stream, int max_blocks) {
  if (table.interior_words > 0 && table.num_items > 0) {
    int64_t blocks = (table.interior_words + kChunkWords - 1) / kChunkWords;
    if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
    InteriorKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(table, sum);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (table.num_boundary > 0 && table.num_items > 0) {
    const int64_t blocks = (table.num_boundary + kThreads - 1) / kThreads;
    BoundaryKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(table, bucket_bytes,
                                                                               sum);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace wsync::cuda
