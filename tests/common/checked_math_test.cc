// checked_math: every helper refuses overflow and negative sizes, naming the
// caller's context.
#include "common/checked_math.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace wsync {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k62 = int64_t{1} << 62;

bool Names(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST(CheckedMathTest, AddAndMulRefuseOverflowAndNegatives) {
  EXPECT_EQ(*CheckedAdd(3, 4, "x"), 7);
  EXPECT_EQ(*CheckedMul(3, 4, "x"), 12);
  EXPECT_EQ(*CheckedAdd(kMax - 1, 1, "x"), kMax);
  auto sum = CheckedAdd(k62, k62, "tensor 'w'");
  ASSERT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(sum.status(), "tensor 'w'")) << sum.status();
  EXPECT_TRUE(Names(sum.status(), "overflows")) << sum.status();
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31, "x").ok());
  EXPECT_FALSE(CheckedAdd(-1, 2, "x").ok());
  EXPECT_FALSE(CheckedMul(2, -1, "x").ok());
}

TEST(CheckedMathTest, ElementsAndBytesOfShapes) {
  EXPECT_EQ(*CheckedNumElements({}, "x"), 1);
  EXPECT_EQ(*CheckedNumElements({4, 0, 8}, "x"), 0);
  EXPECT_EQ(*CheckedBytes({4, 8}, 2, "x"), 64);
  EXPECT_FALSE(CheckedNumElements({int64_t{1} << 32, int64_t{1} << 32}, "x").ok());
  EXPECT_FALSE(CheckedNumElements({4, -1}, "x").ok());
  auto bytes = CheckedBytes({k62}, 4, "tensor 'wide'");
  ASSERT_FALSE(bytes.ok());
  EXPECT_TRUE(Names(bytes.status(), "tensor 'wide'")) << bytes.status();
  EXPECT_FALSE(CheckedBytes({4}, 0, "x").ok());
}

TEST(CheckedMathTest, RangeWithinNeverFormsAnOverflowingSum) {
  EXPECT_TRUE(RangeWithin(0, 16, 16, "x").ok());
  EXPECT_TRUE(RangeWithin(16, 0, 16, "x").ok());
  EXPECT_TRUE(RangeWithin(kMax, 0, kMax, "x").ok());
  EXPECT_EQ(RangeWithin(8, 9, 16, "x").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(RangeWithin(17, 0, 16, "x").code(), absl::StatusCode::kOutOfRange);
  // The attack of issue 18: 2^62 + 2^62 wraps negative in a naive check.
  absl::Status s = RangeWithin(k62, k62, 1 << 20, "shm '/w'");
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(Names(s, "shm '/w'")) << s;
  EXPECT_EQ(RangeWithin(kMax, kMax, kMax, "x").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(RangeWithin(-1, 1, 16, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RangeWithin(1, -1, 16, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RangeWithin(0, 0, -1, "x").code(), absl::StatusCode::kOutOfRange);
}

TEST(CheckedMathTest, StridedExtentCountsTheStrides) {
  // A 4 x 8 view in rows of 100 elements: 3 * 100 + 7 + 1 elements.
  EXPECT_EQ(*StridedExtent({4, 8}, {100, 1}, 2, "x"), (3 * 100 + 8) * 2);
  EXPECT_EQ(*StridedExtent({4, 0}, {100, 1}, 2, "x"), 0);
  EXPECT_EQ(*StridedExtent({}, {}, 4, "x"), 4);
  EXPECT_EQ(*StridedExtent({2}, {int64_t{1} << 40}, 1, "x"), (int64_t{1} << 40) + 1);
  auto over = StridedExtent({3, 2}, {k62, 1}, 4, "fragment 0 of 'w'");
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(Names(over.status(), "fragment 0 of 'w'")) << over.status();
  EXPECT_FALSE(StridedExtent({2}, {k62}, 2, "x").ok()) << "(2^62 + 1) * 2 overflows";
  EXPECT_FALSE(StridedExtent({2}, {-1}, 2, "x").ok());
  EXPECT_FALSE(StridedExtent({2, 2}, {1}, 2, "x").ok());
}

}  // namespace
}  // namespace wsync
