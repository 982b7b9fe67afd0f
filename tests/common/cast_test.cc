#include "common/cast.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace wsync {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

struct NarrowCase {
  const char* name;
  int bits;
  float (*to_float)(uint32_t);
  uint32_t (*from_float)(float);
};

float Bf16In(uint32_t c) { return Bf16ToFloat(static_cast<uint16_t>(c)); }
uint32_t Bf16Out(float f) { return FloatToBf16(f); }
float Fp16In(uint32_t c) { return Fp16ToFloat(static_cast<uint16_t>(c)); }
uint32_t Fp16Out(float f) { return FloatToFp16(f); }
float E4M3In(uint32_t c) { return Fp8E4M3ToFloat(static_cast<uint8_t>(c)); }
uint32_t E4M3Out(float f) { return FloatToFp8E4M3(f); }
float E5M2In(uint32_t c) { return Fp8E5M2ToFloat(static_cast<uint8_t>(c)); }
uint32_t E5M2Out(float f) { return FloatToFp8E5M2(f); }

const NarrowCase kCases[] = {{"bf16", 16, Bf16In, Bf16Out},
                             {"fp16", 16, Fp16In, Fp16Out},
                             {"fp8_e4m3", 8, E4M3In, E4M3Out},
                             {"fp8_e5m2", 8, E5M2In, E5M2Out}};

// Every bit pattern survives narrow -> fp32 -> narrow; NaNs stay NaN with
// their sign.
TEST(CastTest, EveryPatternRoundTripsThroughFp32) {
  for (const NarrowCase& c : kCases) {
    for (uint32_t code = 0; code < (1u << c.bits); ++code) {
      const float f = c.to_float(code);
      const uint32_t back = c.from_float(f);
      if (std::isnan(f)) {
        EXPECT_TRUE(std::isnan(c.to_float(back))) << c.name << " " << code;
        EXPECT_EQ(back >> (c.bits - 1), code >> (c.bits - 1)) << c.name << " sign " << code;
      } else {
        EXPECT_EQ(back, code) << c.name << " pattern " << code << " value " << f;
      }
    }
  }
}

// For every pair of adjacent finite positive values: the exact midpoint rounds
// to the one with an even mantissa, and anything off the midpoint rounds to
// the nearer one.
TEST(CastTest, RoundsToNearestEvenBetweenEveryAdjacentPair) {
  for (const NarrowCase& c : kCases) {
    const uint32_t sign_bit = 1u << (c.bits - 1);
    int checked = 0;
    for (uint32_t lo = 0; lo + 1 < sign_bit; ++lo) {
      const float a = c.to_float(lo), b = c.to_float(lo + 1);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = a + (b - a) / 2;  // exact: narrow values have few bits
      ASSERT_GT(mid, a);
      ASSERT_LT(mid, b);
      const uint32_t even = (lo & 1) == 0 ? lo : lo + 1;
      EXPECT_EQ(c.from_float(mid), even) << c.name << " mid of " << lo;
      EXPECT_EQ(c.from_float(-mid), even | sign_bit) << c.name << " -mid of " << lo;
      EXPECT_EQ(c.from_float(std::nextafter(mid, 0.0f)), lo) << c.name << " below mid " << lo;
      EXPECT_EQ(c.from_float(std::nextafter(mid, std::numeric_limits<float>::infinity())), lo + 1)
          << c.name << " above mid " << lo;
      ++checked;
    }
    EXPECT_GT(checked, 100) << c.name;
  }
}

TEST(CastTest, KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3F80);                     // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3F82);                 // tie -> even (up)
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // overflow -> inf
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000)), 0x0001);               // fp32 subnormal kept
  EXPECT_EQ(FloatToBf16(FromBits(0x7FA00001)), 0x7FE0);  // NaN: quiet, payload top bits
  EXPECT_EQ(FloatToBf16(FromBits(0xFF800001)) & 0xFF80, 0xFF80);

  EXPECT_EQ(FloatToFp16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);  // tie between max and 2^16 -> inf
  EXPECT_EQ(FloatToFp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFp16(0x1p-25f), 0x0000);  // tie with 0 -> even (0)
  EXPECT_EQ(FloatToFp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(FloatToFp16(0x1p-14f), 0x0400);      // smallest normal
  EXPECT_EQ(FloatToFp16(0x1.ffcp-15f), 0x0400);  // subnormal rounding carries into normal
  EXPECT_EQ(FloatToFp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  EXPECT_EQ(Fp16ToFloat(0x3555), 0x1.554p-2f);

  EXPECT_EQ(FloatToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(470.0f), 0x7E);  // would round to the NaN code: saturates
  EXPECT_EQ(FloatToFp8E4M3(1e6f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-1e6f), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(std::nanf("")), 0x7F);
  EXPECT_EQ(FloatToFp8E4M3(-std::nanf("")), 0xFF);
  EXPECT_EQ(FloatToFp8E4M3(0x1p-9f), 0x01);   // smallest subnormal
  EXPECT_EQ(FloatToFp8E4M3(0x1p-10f), 0x00);  // tie -> 0
  EXPECT_EQ(Fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7F)));
  EXPECT_EQ(Fp8E4M3ToFloat(0x78), 256.0f);  // exponent 15 is a normal exponent in e4m3fn

  EXPECT_EQ(FloatToFp8E5M2(1.0f), 0x3C);
  EXPECT_EQ(FloatToFp8E5M2(57344.0f), 0x7B);
  EXPECT_EQ(FloatToFp8E5M2(61440.0f), 0x7C);  // tie with 2^16 -> inf
  EXPECT_EQ(FloatToFp8E5M2(1e9f), 0x7C);
  EXPECT_EQ(FloatToFp8E5M2(0x1p-16f), 0x01);
  EXPECT_TRUE(std::isinf(Fp8E5M2ToFloat(0xFC)));
  EXPECT_TRUE(std::isnan(Fp8E5M2ToFloat(0x7D)));
}

TEST(CastTest, ConvertElementsAllFloatPairsMatchScalar) {
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.0f,
                                     -1.5f,
                                     3.14159f,
                                     1e-3f,
                                     -250.0f,
                                     448.0f,
                                     6e4f,
                                     1e-7f,
                                     std::numeric_limits<float>::infinity()};
  const DType floats[] = {v1::FP32, v1::BF16, v1::FP16, v1::FP8_E4M3, v1::FP8_E5M2};
  for (DType from : floats) {
    std::vector<uint8_t> src(values.size() * DTypeSize(from));
    ASSERT_TRUE(ConvertElements(values.data(), v1::FP32, src.data(), from, values.size()).ok());
    std::vector<float> src_f(values.size());
    ASSERT_TRUE(ConvertElements(src.data(), from, src_f.data(), v1::FP32, values.size()).ok());
    for (DType to : floats) {
      std::vector<uint8_t> dst(values.size() * DTypeSize(to));
      ASSERT_TRUE(ConvertElements(src.data(), from, dst.data(), to, values.size()).ok());
      std::vector<uint8_t> expect(dst.size());
      ASSERT_TRUE(ConvertElements(src_f.data(), v1::FP32, expect.data(), to, values.size()).ok());
      EXPECT_EQ(dst, expect) << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

TEST(CastTest, IntegersOnlyToThemselves) {
  const int32_t ints[3] = {1, -2, 1 << 30};
  int32_t out[3] = {};
  ASSERT_TRUE(ConvertElements(ints, v1::INT32, out, v1::INT32, 3).ok());
  EXPECT_EQ(out[2], 1 << 30);
  float f[3];
  const absl::Status s = ConvertElements(ints, v1::INT32, f, v1::FP32, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int32"), std::string::npos) << s;
  EXPECT_FALSE(ConvertElements(f, v1::FP32, out, v1::INT32, 3).ok());
  EXPECT_FALSE(ConvertElements(f, v1::BOOL, out, v1::UINT8, 3).ok());
  EXPECT_FALSE(ConvertElements(f, v1::DTYPE_UNSPECIFIED, out, v1::DTYPE_UNSPECIFIED, 3).ok());
  EXPECT_FALSE(ConvertElements(f, v1::FP32, out, v1::FP32, -1).ok());
  EXPECT_TRUE(CanConvert(v1::FP8_E4M3, v1::BF16));
  EXPECT_FALSE(CanConvert(v1::INT8, v1::UINT8));
}

TEST(CastTest, ReduceSumAndAvg) {
  const float a[4] = {1.0f, 2.0f, -3.0f, 0.5f};
  const float b[4] = {10.0f, 20.0f, 3.0f, 0.25f};
  const float c[4] = {100.0f, 0.0f, 1.0f, 0.25f};
  float out[4];
  const void* in[3] = {a, b, c};
  ASSERT_TRUE(ReduceElements(in, v1::FP32, v1::REDUCE_SUM, out, 4).ok());
  EXPECT_EQ(out[0], 111.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 1.0f);
  ASSERT_TRUE(ReduceElements(in, v1::FP32, v1::REDUCE_AVG, out, 4).ok());
  EXPECT_EQ(out[0], 37.0f);
  EXPECT_FLOAT_EQ(out[1], 22.0f / 3);

  // bf16: fp32 accumulation, one rounding at the end. 256 + 1 + 1 in bf16
  // steps would stay 256; accumulated in fp32 it is 258.
  const uint16_t x[1] = {FloatToBf16(256.0f)}, y[1] = {FloatToBf16(1.0f)};
  const void* bin[3] = {x, y, y};
  uint16_t bout[1];
  ASSERT_TRUE(ReduceElements(bin, v1::BF16, v1::REDUCE_SUM, bout, 1).ok());
  EXPECT_EQ(Bf16ToFloat(bout[0]), 258.0f);

  const int8_t i1[2] = {100, -5}, i2[2] = {100, 3};
  const void* iin[2] = {i1, i2};
  int8_t iout[2];
  ASSERT_TRUE(ReduceElements(iin, v1::INT8, v1::REDUCE_SUM, iout, 2).ok());
  EXPECT_EQ(iout[0], static_cast<int8_t>(200));  // wraps
  EXPECT_EQ(iout[1], -2);
  EXPECT_FALSE(ReduceElements(iin, v1::INT8, v1::REDUCE_AVG, iout, 2).ok());
  EXPECT_FALSE(ReduceElements(iin, v1::BOOL, v1::REDUCE_SUM, iout, 2).ok());
  EXPECT_FALSE(ReduceElements({}, v1::FP32, v1::REDUCE_SUM, out, 2).ok());

  // dst may alias the first input.
  float acc[4] = {1, 2, 3, 4};
  const void* alias[2] = {acc, b};
  ASSERT_TRUE(ReduceElements(alias, v1::FP32, v1::REDUCE_SUM, acc, 4).ok());
  EXPECT_EQ(acc[1], 22.0f);
}

TEST(CastTest, LongArraysAcrossChunks) {
  std::vector<float> a(10000), b(10000);
  for (int i = 0; i < 10000; ++i) {
    a[i] = i * 0.5f;
    b[i] = -i * 0.25f;
  }
  std::vector<float> out(10000);
  const void* in[2] = {a.data(), b.data()};
  ASSERT_TRUE(ReduceElements(in, v1::FP32, v1::REDUCE_SUM, out.data(), 10000).ok());
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(out[i], i * 0.25f) << i;
  std::vector<uint16_t> h(10000);
  ASSERT_TRUE(ConvertElements(out.data(), v1::FP32, h.data(), v1::FP16, 10000).ok());
  for (int i = 0; i < 10000; i += 997) EXPECT_EQ(h[i], FloatToFp16(out[i]));
}

}  // namespace
}  // namespace wsync
