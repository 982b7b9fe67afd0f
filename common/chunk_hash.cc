#include "common/chunk_hash.h"

#include <cstring>

namespace wsync::chunk_hash {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "words are read little-endian");

uint64_t Hash(const void* data, int64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const int64_t words = bytes / 8;
  uint64_t sum = 0;
  for (int64_t k = 0; k < words; ++k) {
    uint64_t w;
    std::memcpy(&w, p + 8 * k, 8);
    sum += Term(w, k);
  }
  if (bytes % 8 != 0) sum += Term(TailWord(p + 8 * words, bytes % 8), words);
  return Finish(sum, bytes);
}

}  // namespace wsync::chunk_hash
