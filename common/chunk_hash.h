// The bucket checksum of staged syncs (docs/staging.md): a 64-bit hash of a
// byte range whose words are hashed independently and summed, so that a GPU
// reads the range once, coalesced, at memory speed (every thread a stride of
// words), and gets the host's result bit for bit.
//
//   word k (k = 0 .. ceil(n / 8) - 1) of n bytes: the 8 bytes at 8k,
//   little-endian, the last word zero-padded
//     Term(w, k) = Mix(w ^ (kSeed + k * kP1))
//   Hash(n bytes) = Mix((sum over words of Term(w_k, k)) ^ (n * kP2))
// (sums and products mod 2^64). Mix is a bijection, so a changed word
// changes its term; the word's index in its term ties it to its position
// (swapped or shifted words are caught); the length is part of the hash.
// Not cryptographic: it catches corruption and misplaced bytes, not an
// attacker who controls both ends.
//
// (Session 14's definition chained each 4 KiB chunk word by word: one GPU
// thread per chunk, reads 4 KiB apart, ~8x a sync's time. Workers of both
// definitions in one pool disagree on every bucket, and the sync names the
// first mismatch.)
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

inline constexpr uint64_t kSeed = 0x27d4eb2f165667c5ULL;
inline constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL;
inline constexpr uint64_t kP2 = 0xc2b2ae3d27d4eb4fULL;

// A bijective 64-bit finalizer (xor-shift-multiply).
WSYNC_HD uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Word `index`'s term of the sum.
WSYNC_HD uint64_t Term(uint64_t word, int64_t index) {
  return Mix(word ^ (kSeed + static_cast<uint64_t>(index) * kP1));
}

// The last, partial word: `bytes` (1..7) bytes at `p`, zero-padded.
WSYNC_HD uint64_t TailWord(const unsigned char* p, int64_t bytes) {
  uint64_t w = 0;
  for (int64_t b = 0; b < bytes; ++b) w |= static_cast<uint64_t>(p[b]) << (8 * b);
  return w;
}

WSYNC_HD uint64_t Finish(uint64_t sum, int64_t total_bytes) {
  return Mix(sum ^ (static_cast<uint64_t>(total_bytes) * kP2));
}

// The hash of `bytes` bytes at host address `data` (null only when 0 bytes).
uint64_t Hash(const void* data, int64_t bytes);

}  // namespace wsync::chunk_hash

#undef WSYNC_HD

#endif  // WSYNC_COMMON_CHUNK_HASH_H_
