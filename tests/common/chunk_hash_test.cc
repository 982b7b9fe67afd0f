#include "common/chunk_hash.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace wsync::chunk_hash {
namespace {

// The definition, byte by byte (the form the GPU's unaligned path runs),
// against Hash's word reads.
uint64_t Reference(const std::vector<unsigned char>& v) {
  uint64_t sum = 0;
  const int64_t n = static_cast<int64_t>(v.size());
  for (int64_t k = 0; 8 * k < n; ++k) {
    const int64_t len = n - 8 * k < 8 ? n - 8 * k : 8;
    sum += Term(TailWord(v.data() + 8 * k, len), k);
  }
  return Finish(sum, n);
}

std::vector<unsigned char> Bytes(int64_t n, uint32_t seed) {
  std::vector<unsigned char> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

TEST(ChunkHashTest, FastPathEqualsTheDefinitionAtEverySizeClass) {
  for (int64_t n : {0, 1, 7, 8, 9, 63, 4095, 4096, 4097, 8192, 3 * 4096 + 5, 100000}) {
    const auto v = Bytes(n, static_cast<uint32_t>(n));
    EXPECT_EQ(Hash(v.data(), n), Reference(v)) << n << " bytes";
  }
}

TEST(ChunkHashTest, EveryFlippedBitAndEverySwapChangesTheHash) {
  auto v = Bytes(9000, 7);
  const uint64_t h = Hash(v.data(), 9000);
  for (size_t i : {size_t{0}, size_t{7}, size_t{4095}, size_t{4096}, size_t{8999}}) {
    for (int bit = 0; bit < 8; ++bit) {
      v[i] ^= static_cast<unsigned char>(1u << bit);
      EXPECT_NE(Hash(v.data(), 9000), h) << "byte " << i << " bit " << bit;
      v[i] ^= static_cast<unsigned char>(1u << bit);
    }
  }
  // Two 4 KiB halves swapped: the sum alone would not see it, the word
  // index in each term does.
  std::vector<unsigned char> swapped(v.begin() + 4096, v.begin() + 8192);
  swapped.insert(swapped.end(), v.begin(), v.begin() + 4096);
  std::vector<unsigned char> original(v.begin(), v.begin() + 8192);
  EXPECT_NE(Hash(swapped.data(), 8192), Hash(original.data(), 8192));
  // Trailing zeros are not free: the length is part of the hash.
  std::vector<unsigned char> zeros(16, 0);
  EXPECT_NE(Hash(zeros.data(), 15), Hash(zeros.data(), 16));
  // Two adjacent words exchanged.
  auto w = Bytes(64, 3);
  auto x = w;
  std::swap_ranges(x.begin(), x.begin() + 8, x.begin() + 8);
  EXPECT_NE(Hash(w.data(), 64), Hash(x.data(), 64));
}

TEST(ChunkHashTest, DistinctInputsGiveDistinctHashes) {
  std::set<uint64_t> seen;
  for (uint32_t s = 0; s < 2000; ++s) {
    const auto v = Bytes(64, s);
    seen.insert(Hash(v.data(), 64));
  }
  EXPECT_EQ(seen.size(), 2000u);
}

}  // namespace
}  // namespace wsync::chunk_hash
