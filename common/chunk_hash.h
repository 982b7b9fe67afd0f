// The bucket checksum of staged syncs (docs/staging.md): a 64-bit hash of a
// byte range, defined chunk by chunk so that a GPU computes it with one
// thread per chunk and gets the host's result bit for bit.
//
//   chunk c (kChunkBytes bytes, the last one shorter) of n bytes:
//     h = kSeed ^ (c * kP1)
//     for each 8-byte little-endian word w of the chunk (the last word
//     zero-padded): h = Rotl(h ^ (w * kP2), 31) * kP1
//     ChunkHash(c) = Mix(h ^ chunk_bytes)
//   Hash(n bytes) = Mix(sum over chunks of Mix(ChunkHash(c) + c * kP3) ^ n)
// (sums and products mod 2^64). The sum makes the combination order-free.
// Not cryptographic: it catches corruption and misplaced bytes (each word is
// tied to its position), not an attacker who controls both ends.
//
// Usable from CUDA code (worker/backends/cuda/checksum_kernel.cu includes it):
// the functions are __host__ __device__ there.
#ifndef WSYNC_COMMON_CHUNK_HASH_H_
#define WSYNC_COMMON_CHUNK_HASH_H_

#include <cstdint>

#ifdef __CUDACC__
#define WSYNC_HD __host__ __device__ inline
#else
#define WSYNC_HD inline
#endif

namespace wsync::chunk_hash {

inline constexpr int64_t kChunkBytes = 4096;
inline constexpr uint64_t kSeed = 0x27d4eb2f165667c5ULL;
inline constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL;
inline constexpr uint64_t kP2 = 0xc2b2ae3d27d4eb4fULL;
inline constexpr uint64_t kP3 = 0x165667b19e3779f9ULL;

WSYNC_HD uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// A bijective 64-bit finalizer (xor-shift-multiply).
WSYNC_HD uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Chunk `index` of a range: `bytes` (1..kChunkBytes) bytes at `p`.
WSYNC_HD uint64_t ChunkHash(const unsigned char* p, int64_t bytes, int64_t index) {
  uint64_t h = kSeed ^ (static_cast<uint64_t>(index) * kP1);
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w = 0;
    for (int b = 0; b < 8; ++b) w |= static_cast<uint64_t>(p[i + b]) << (8 * b);
    h = Rotl(h ^ (w * kP2), 31) * kP1;
  }
  if (i < bytes) {
    uint64_t w = 0;
    for (int b = 0; i + b < bytes; ++b) w |= static_cast<uint64_t>(p[i + b]) << (8 * b);
    h = Rotl(h ^ (w * kP2), 31) * kP1;
  }
  return Mix(h ^ static_cast<uint64_t>(bytes));
}

// One chunk's term of the sum.
WSYNC_HD uint64_t ChunkTerm(uint64_t chunk_hash, int64_t index) {
  return Mix(chunk_hash + static_cast<uint64_t>(index) * kP3);
}

WSYNC_HD uint64_t Finish(uint64_t sum, int64_t total_bytes) {
  return Mix(sum ^ static_cast<uint64_t>(total_bytes));
}

// The hash of `bytes` bytes at host address `data` (null only when 0 bytes).
uint64_t Hash(const void* data, int64_t bytes);

}  // namespace wsync::chunk_hash

#undef WSYNC_HD

#endif  // WSYNC_COMMON_CHUNK_HASH_H_
