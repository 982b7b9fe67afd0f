#include "common/chunk_hash.h"

#include <cstring>

namespace wsync::chunk_hash {
namespace {

// ChunkHash with whole words read at once (little-endian hosts only, as the
// static_assert below demands): the same value, several times faster.
uint64_t ChunkHashFast(const unsigned char* p, int64_t bytes, int64_t index) {
  uint64_t h = kSeed ^ (static_cast<uint64_t>(index) * kP1);
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = Rotl(h ^ (w * kP2), 31) * kP1;
  }
  if (i < bytes) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, static_cast<size_t>(bytes - i));
    h = Rotl(h ^ (w * kP2), 31) * kP1;
  }
  return Mix(h ^ static_cast<uint64_t>(bytes));
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the fast path reads little-endian words");

}  // namespace

uint64_t Hash(const void* data, int64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t sum = 0;
  int64_t index = 0;
  for (int64_t off = 0; off < bytes; off += kChunkBytes, ++index) {
    const int64_t n = bytes - off < kChunkBytes ? bytes - off : kChunkBytes;
    sum += ChunkTerm(ChunkHashFast(p + off, n, index), index);
  }
  return Finish(sum, bytes);
}

}  // namespace wsync::chunk_hash
