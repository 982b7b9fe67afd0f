// PutList (host only: runs without a GPU). The parts Emit produces must
// write exactly the bytes of the puts added, and interleave peers.
#include "worker/backends/cuda/put_list.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace wsync::cuda {
namespace {

// Applies copy-engine copies on host memory as cudaMemcpy2D would.
void Apply(const std::vector<PutCopy>& copies) {
  for (const PutCopy& c : copies) {
    for (size_t r = 0; r < c.height; ++r) {
      std::memcpy(static_cast<char*>(c.dst) + r * c.dst_pitch,
                  static_cast<const char*>(c.src) + r * c.src_pitch, c.width);
    }
  }
}

PutCopy Copy2D(const std::vector<char>& src, std::vector<char>& dst, size_t rows, size_t width,
               size_t src_pitch, size_t dst_pitch, size_t item) {
  return PutCopy{dst.data(), dst_pitch, src.data(), src_pitch, width, rows, item};
}

TEST(PutListTest, CutAndInterleavedCopiesWriteExactlyWhatTheWholeOnesDo) {
  std::vector<char> src(3 << 20);
  std::iota(src.begin(), src.end(), 0);
  // Two peers: a 1-D copy of 3 MiB - 5 bytes, and a strided 2-D copy.
  std::vector<char> want_a(3 << 20, 0), want_b(1 << 20, 0), got_a = want_a, got_b = want_b;
  const PutCopy one_d{nullptr, 0, src.data() + 5, 0, (3u << 20) - 5, 1, 0};
  PutCopy a = one_d, ga = one_d;
  a.dst = want_a.data();
  a.dst_pitch = a.width;
  ga.dst = got_a.data();
  ga.dst_pitch = ga.width;
  const PutCopy b = Copy2D(src, want_b, 1000, 700, 2048, 1024, 1);
  const PutCopy gb = Copy2D(src, got_b, 1000, 700, 2048, 1024, 1);
  Apply({a, b});

  PutList list;
  list.AddCopy(ga, /*peer=*/2);
  list.AddCopy(gb, /*peer=*/3);
  EXPECT_EQ(list.peers(), (std::vector<int>{2, 3}));
  PieceTable table;
  std::vector<PutCopy> copies;
  int64_t bytes = 0;
  ASSERT_TRUE(list.Emit(/*self=*/1, /*max_part_bytes=*/256 << 10, &table, &copies, &bytes).ok());
  EXPECT_EQ(bytes, static_cast<int64_t>(ga.width + 700 * 1000));
  EXPECT_GT(copies.size(), 10u);  // cut
  EXPECT_TRUE(table.empty());
  // Peer 3's 3 parts are spread among peer 2's 12: one within the first 3.
  size_t first_b = copies.size();
  for (size_t i = 0; i < copies.size() && first_b == copies.size(); ++i) {
    if (copies[i].dst_pitch == 1024u) first_b = i;
  }
  EXPECT_LT(first_b, 3u);
  Apply(copies);
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
}

TEST(PutListTest, OnePeerOrNoPartSizeKeepsThePutsWhole) {
  std::vector<char> src(1 << 20), dst(1 << 20);
  PutList list;
  list.AddCopy(PutCopy{dst.data(), 0, src.data(), 0, 1 << 20, 1, 0}, 1);
  list.AddCopy(PutCopy{dst.data(), 0, src.data(), 0, 1 << 19, 1, 1}, 1);
  PieceTable table;
  std::vector<PutCopy> copies;
  int64_t bytes = 0;
  ASSERT_TRUE(list.Emit(0, 4096, &table, &copies, &bytes).ok());
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].item, 0u);
  list.AddCopy(PutCopy{dst.data(), 0, src.data(), 0, 1 << 19, 1, 2}, 2);
  copies.clear();
  ASSERT_TRUE(list.Emit(0, 0, &table, &copies, &bytes).ok());
  EXPECT_EQ(copies.size(), 3u);
}

TEST(PutListTest, KernelRequestsAreCutByRowsAndKeepEveryByte) {
  std::vector<uint16_t> src(4096 * 64), dst(4096 * 64);
  PutList list;
  for (int peer = 0; peer < 3; ++peer) {
    PutRequest r;
    r.src = src.data();
    r.src_dtype = v1::BF16;
    r.dst = dst.data();
    r.dst_dtype = v1::BF16;
    r.n = 2;
    r.shape[0] = 4096;
    r.shape[1] = 64;
    r.src_strides[0] = r.dst_strides[0] = 64;
    r.src_strides[1] = r.dst_strides[1] = 1;
    r.item = peer;
    list.AddRequest(r, peer);
  }
  PieceTable whole, cut;
  std::vector<PutCopy> copies;
  int64_t bytes = 0;
  ASSERT_TRUE(list.Emit(0, 0, &whole, &copies, &bytes).ok());
  ASSERT_TRUE(list.Emit(0, 64 << 10, &cut, &copies, &bytes).ok());
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(cut.bytes_written(), whole.bytes_written());
  EXPECT_EQ(whole.bytes_written(), 3 * 4096 * 64 * 2);
  EXPECT_EQ(cut.pieces().size(), 3 * 8u);  // 512 KiB each, in 64 KiB parts
}

}  // namespace
}  // namespace wsync::cuda
