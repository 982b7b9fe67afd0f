#include "common/block_fp8.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/cast.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

// Independent e4m3fn decoder (not cast.cc's table): 1 sign, 4 exponent bits
// (bias 7), 3 mantissa bits, no inf, 0x7f / 0xff NaN.
double DecodeE4M3(uint8_t b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

// Nearest e4m3 by brute force over all finite codes, ties to the even code,
// beyond 448 saturating.
uint8_t RefRound(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double v = DecodeE4M3(static_cast<uint8_t>(c));
    if (std::isnan(v) || (std::signbit(v) != std::signbit(f) && v != 0)) continue;
    const double err = std::fabs(v - static_cast<double>(f));
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  if (std::signbit(f) && DecodeE4M3(best) == 0) best = 0x80;
  return best;
}

// Reference over a grid: per block amax, scale = amax / 448 (1 if 0).
void RefQuantize(const std::vector<float>& x, const BlockGrid& g, std::vector<uint8_t>* q,
                 std::vector<float>* s) {
  q->assign(x.size(), 0);
  s->assign(g.num_blocks(), 0);
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t bi = 0; bi < g.row_blocks(); ++bi) {
      for (int64_t bj = 0; bj < g.col_blocks(); ++bj) {
        float amax = 0;
        for (int64_t r = bi * g.block_rows; r < std::min(g.rows, (bi + 1) * g.block_rows); ++r) {
          for (int64_t c = bj * g.block_cols; c < std::min(g.cols, (bj + 1) * g.block_cols); ++c) {
            amax = std::max(amax, std::fabs(x[(o * g.rows + r) * g.cols + c]));
          }
        }
        const float scale = amax == 0 ? 1.0f : amax / 448.0f;
        (*s)[(o * g.row_blocks() + bi) * g.col_blocks() + bj] = scale;
        for (int64_t r = bi * g.block_rows; r < std::min(g.rows, (bi + 1) * g.block_rows); ++r) {
          for (int64_t c = bj * g.block_cols; c < std::min(g.cols, (bj + 1) * g.block_cols); ++c) {
            const int64_t i = (o * g.rows + r) * g.cols + c;
            (*q)[i] = RefRound(x[i] / scale);
          }
        }
      }
    }
  }
}

TEST(BlockFp8Test, RoundsToNearestEvenWithUnitScale) {
  // amax 448 gives scale 1: the values are rounded as they are.
  BlockGrid g{1, 1, 8, 128, 128};
  std::vector<float> x = {448.0f, 1.0625f, 1.1875f, -1.0625f, 0.0f, 3.0f, 0.001953125f, 17.0f};
  std::vector<uint8_t> q(8);
  std::vector<float> s(1);
  ASSERT_TRUE(QuantizeBlocksFp8E4M3(x.data(), g, q.data(), s.data()).ok());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(q[0], 0x7e);                 // 448
  EXPECT_EQ(DecodeE4M3(q[1]), 1.0);      // tie 1 / 1.125 -> even (1.0)
  EXPECT_EQ(DecodeE4M3(q[2]), 1.25);     // tie 1.125 / 1.25 -> even (1.25)
  EXPECT_EQ(DecodeE4M3(q[3]), -1.0);
  EXPECT_EQ(q[4], 0x00);
  EXPECT_EQ(DecodeE4M3(q[5]), 3.0);
  EXPECT_EQ(DecodeE4M3(q[6]), 0.001953125);  // smallest subnormal, exact
  EXPECT_EQ(DecodeE4M3(q[7]), 16.0);     // tie 16 / 18 -> even (16)
}

TEST(BlockFp8Test, SaturatesAt448) {
  EXPECT_EQ(FloatToFp8E4M3(449.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(1e9f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-1e9f), 0xfe);
  // An amax whose x / (amax / 448) rounds above 448 in fp32 still gives 448.
  int found = 0;
  for (int k = 1; k < 20000 && found < 3; ++k) {
    const float amax = 1.0f + k * 0.000731f;
    if (amax / (amax / 448.0f) > 448.0f) {
      ++found;
      BlockGrid g{1, 1, 2, 128, 128};
      std::vector<float> x = {-amax, 0.5f};
      std::vector<uint8_t> q(2);
      std::vector<float> s(1);
      ASSERT_TRUE(QuantizeBlocksFp8E4M3(x.data(), g, q.data(), s.data()).ok());
      EXPECT_EQ(q[0], 0xfe) << amax;
    }
  }
  EXPECT_GT(found, 0) << "no amax found whose ratio exceeds 448 in fp32";
}

TEST(BlockFp8Test, ZeroBlockHasUnitScale) {
  BlockGrid g{1, 4, 4, 2, 2};
  std::vector<float> x(16, 0.0f);
  x[15] = -2.0f;  // only block (1, 1) is nonzero
  std::vector<uint8_t> q(16);
  std::vector<float> s(4);
  ASSERT_TRUE(QuantizeBlocksFp8E4M3(x.data(), g, q.data(), s.data()).ok());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_EQ(s[3], 2.0f / 448.0f);
  EXPECT_EQ(q[15], 0xfe);  // -448: the block's amax maps to the top code
  EXPECT_EQ(q[10], 0x00);
}

TEST(BlockFp8Test, PartialEdgeBlocksAndOuterDimMatchReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (const BlockGrid& g : {BlockGrid{1, 130, 200, 128, 128}, BlockGrid{3, 5, 7, 2, 3},
                             BlockGrid{2, 256, 128, 128, 128}, BlockGrid{1, 1, 1, 128, 128}}) {
    std::vector<float> x(g.num_elements());
    for (float& v : x) v = dist(rng);
    x[0] = 0.5f;  // one block with an outlier
    std::vector<uint8_t> q(x.size()), want_q;
    std::vector<float> s(g.num_blocks()), want_s;
    ASSERT_TRUE(QuantizeBlocksFp8E4M3(x.data(), g, q.data(), s.data()).ok());
    RefQuantize(x, g, &want_q, &want_s);
    EXPECT_EQ(s, want_s) << g.outer << "x" << g.rows << "x" << g.cols;
    EXPECT_EQ(q, want_q) << g.outer << "x" << g.rows << "x" << g.cols;
    // Dequantized values are within half an e4m3 step (relative 1/16) of x.
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t o = i / (g.rows * g.cols), r = (i / g.cols) % g.rows, c = i % g.cols;
      const float scale =
          s[(o * g.row_blocks() + r / g.block_rows) * g.col_blocks() + c / g.block_cols];
      const double deq = DecodeE4M3(q[i]) * scale;
      EXPECT_LE(std::fabs(deq - x[i]), std::fabs(x[i]) / 16 + scale * 0.001953125 / 2 + 1e-12)
          << i;
    }
  }
}

TEST(BlockFp8Test, FromBf16WidensExactly) {
  BlockGrid g{1, 2, 3, 128, 128};
  std::vector<float> x = {0.75f, -1.5f, 3.0f, 120.0f, -7.0f, 0.0f};
  std::vector<uint16_t> b(6);
  for (int i = 0; i < 6; ++i) b[i] = FloatToBf16(x[i]);
  std::vector<uint8_t> q1(6), q2(6);
  std::vector<float> s1(1), s2(1);
  ASSERT_TRUE(QuantizeBlocksFp8E4M3From(b.data(), v1::BF16, g, q1.data(), s1.data()).ok());
  ASSERT_TRUE(QuantizeBlocksFp8E4M3(x.data(), g, q2.data(), s2.data()).ok());
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(s1[0], 120.0f / 448.0f);
}

TEST(BlockFp8Test, NanSticksToItsBlockWhereverItSits) {
  for (int at = 0; at < 4; ++at) {
    BlockGrid g{1, 1, 8, 1, 4};
    std::vector<float> x = {1.0f, -2.0f, 3.0f, 0.5f, 4.0f, 1.0f, 2.0f, 3.0f};
    x[at] = std::nanf("");
    std::vector<uint8_t> q(8);
    std::vector<float> s(2);
    ASSERT_TRUE(QuantizeBlocksFp8E4M3(x.data(), g, q.data(), s.data()).ok());
    EXPECT_TRUE(std::isnan(s[0])) << at;
    for (int k = 0; k < 4; ++k) EXPECT_EQ(q[k] & 0x7f, 0x7f) << at << " " << k;
    EXPECT_EQ(s[1], 4.0f / 448.0f);  // the other block is untouched
    EXPECT_EQ(q[4], 0x7e);
  }
}

TEST(BlockFp8Test, RejectsBadInput) {
  std::vector<float> x(4);
  std::vector<uint8_t> q(4);
  std::vector<float> s(4);
  EXPECT_EQ(QuantizeBlocksFp8E4M3(x.data(), BlockGrid{1, 2, 2, 0, 128}, q.data(), s.data()).code(),
            absl::StatusCode::kInvalidArgument);
  int32_t ints[4] = {};
  EXPECT_EQ(QuantizeBlocksFp8E4M3From(ints, v1::INT32, BlockGrid{1, 2, 2, 2, 2}, q.data(),
                                      s.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wsync
