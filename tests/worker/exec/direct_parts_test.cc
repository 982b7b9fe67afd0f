// The parts of a direct-write pair (worker/exec/direct_parts.h): equal
// parts, and parts that shrink toward the end so that a receiver's hash
// after the last part is short.
#include "worker/exec/direct_parts.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace wsync::exec {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Each part's bytes, checking that parts are consecutive from 0.
std::vector<int64_t> PartBytes(const std::vector<int64_t>& bytes,
                               const std::vector<int32_t>& part) {
  std::vector<int64_t> out;
  EXPECT_EQ(part.size(), bytes.size());
  for (size_t i = 0; i < part.size(); ++i) {
    if (i == 0) {
      EXPECT_EQ(part[0], 0);
    } else {
      EXPECT_TRUE(part[i] == part[i - 1] || part[i] == part[i - 1] + 1) << "bucket " << i;
    }
    if (out.size() <= static_cast<size_t>(part[i])) out.resize(static_cast<size_t>(part[i]) + 1, 0);
    out[static_cast<size_t>(part[i])] += bytes[i];
  }
  return out;
}

TEST(DirectPartsTest, EqualPartsWithoutATail) {
  const std::vector<int64_t> bytes(16, kMiB);
  const std::vector<int32_t> part = CutDirectParts(bytes, {4, 1, 0});
  EXPECT_EQ(part, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
}

TEST(DirectPartsTest, TheTailShrinksTowardTheEndDownToTheFloor) {
  // 1 GiB in 1 MiB buckets, 16 parts of at least 4 MiB, ratio 4: the last
  // part 4 MiB, then 16 and 64 MiB; the 13 parts before share the rest.
  const std::vector<int64_t> bytes(1024, kMiB);
  const std::vector<int64_t> sizes = PartBytes(bytes, CutDirectParts(bytes, {16, 4 * kMiB, 4}));
  ASSERT_EQ(sizes.size(), 16u);
  EXPECT_EQ(sizes[15], 4 * kMiB);
  EXPECT_EQ(sizes[14], 16 * kMiB);
  EXPECT_EQ(sizes[13], 64 * kMiB);
  for (size_t k = 0; k < 13; ++k) {
    EXPECT_GE(sizes[k], 72 * kMiB) << "part " << k;
    EXPECT_LE(sizes[k], 73 * kMiB) << "part " << k;
  }
  // Equal parts: the last is a sixteenth.
  const std::vector<int64_t> equal = PartBytes(bytes, CutDirectParts(bytes, {16, 4 * kMiB, 1}));
  ASSERT_EQ(equal.size(), 16u);
  EXPECT_EQ(equal[15], 64 * kMiB);
}

TEST(DirectPartsTest, ATailPartIsNeverLargerThanTheEqualPartsBefore) {
  // 16 parts of 64 MiB planned at most: the floor already is the equal share.
  const std::vector<int64_t> bytes(16, 64 * kMiB);
  const std::vector<int64_t> sizes = PartBytes(bytes, CutDirectParts(bytes, {16, 64 * kMiB, 4}));
  EXPECT_EQ(sizes, std::vector<int64_t>(16, 64 * kMiB));
  // Llama-3-8B TP1's ~16 GB in 16 parts, ratio 4: 64 MiB, 256 MiB, 1 GiB at
  // the end, each smaller than the 13 equal parts before.
  const std::vector<int64_t> llama(15316, kMiB);
  const std::vector<int64_t> parts = PartBytes(llama, CutDirectParts(llama, {16, 64 * kMiB, 4}));
  ASSERT_EQ(parts.size(), 16u);
  EXPECT_EQ(parts[15], 64 * kMiB);
  EXPECT_EQ(parts[14], 256 * kMiB);
  EXPECT_EQ(parts[13], 1024 * kMiB);
  EXPECT_GT(parts[12], 1024 * kMiB);
}

TEST(DirectPartsTest, BucketsLargerThanTheFloorKeepTheParts) {
  // Four equal buckets, 4 parts, a floor of 1 byte: a tail part of one
  // bucket would be no smaller than the equal parts, so the parts stay one
  // bucket each (a tail planned by bytes alone would eat the body's parts).
  const std::vector<int64_t> bytes(4, 1000);
  EXPECT_EQ(CutDirectParts(bytes, {4, 1, 4}), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(DirectPartsTest, TheTailEndsWhereABucketIsTooLargeForIt) {
  // From the end: 1 MiB, then 2 x 1 MiB (ratio 2); the 100 MiB bucket is no
  // tail part (larger than an equal part of what is left), so the body
  // (50 and 100 MiB) is cut equally, one bucket a part.
  const std::vector<int64_t> bytes = {50 * kMiB, 100 * kMiB, kMiB, kMiB, kMiB};
  EXPECT_EQ(CutDirectParts(bytes, {8, kMiB, 2}), (std::vector<int32_t>{0, 1, 2, 2, 3}));
}

TEST(DirectPartsTest, EdgeCases) {
  EXPECT_TRUE(CutDirectParts({}, {16, kMiB, 4}).empty());
  EXPECT_EQ(CutDirectParts(std::vector<int64_t>{0, 0, 0}, {16, kMiB, 4}),
            (std::vector<int32_t>{0, 0, 0}));
  // Less than one part's floor: one part.
  EXPECT_EQ(CutDirectParts(std::vector<int64_t>{100, 100}, {16, kMiB, 4}),
            (std::vector<int32_t>{0, 0}));
  // No parts asked: one.
  EXPECT_EQ(CutDirectParts(std::vector<int64_t>{kMiB, kMiB}, {0, 1, 4}),
            (std::vector<int32_t>{0, 0}));
  // Sizes near the limits: no overflow, consecutive parts, at most one a bucket.
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 2;
  const std::vector<int64_t> big = {kBig, kBig, kBig, 1};
  const std::vector<int32_t> part = CutDirectParts(big, {kMaxDirectParts + 10, 1, 1000});
  PartBytes(std::vector<int64_t>(4, 0), part);
  EXPECT_LE(part.back(), 3);
}

}  // namespace
}  // namespace wsync::exec
