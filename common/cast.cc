#include "common/cast.h"

#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wsync {
namespace {

uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}
float BitsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// v / 2^shift rounded to nearest, ties to even.
uint64_t RoundShift(uint64_t v, int shift) {
  if (shift <= 0) return v;
  if (shift >= 63) return 0;
  const uint64_t q = v >> shift;
  const uint64_t rem = v & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  return (rem > half || (rem == half && (q & 1))) ? q + 1 : q;
}

// A narrow binary float: 1 sign bit, E exponent bits, M mantissa bits. `ieee`
// formats reserve the top exponent for inf/NaN; the "fn" formats (e4m3fn)
// only use all-ones for NaN and have no inf.
struct Format {
  int e;
  int m;
  bool ieee;
  int bias() const { return (1 << (e - 1)) - 1; }
  uint32_t exp_mask() const { return (1u << e) - 1; }
  uint32_t man_mask() const { return (1u << m) - 1; }
  uint32_t inf_code() const { return exp_mask() << m; }
  uint32_t max_code() const {
    return ieee ? (((exp_mask() - 1) << m) | man_mask()) : ((exp_mask() << m) | (man_mask() - 1));
  }
};

constexpr Format kFp16{5, 10, true};
constexpr Format kE4M3{4, 3, false};
constexpr Format kE5M2{5, 2, true};

uint32_t FloatToNarrow(float f, const Format& fmt) {
  const uint32_t bits = FloatBits(f);
  const uint32_t sign_out = (bits >> 31) << (fmt.e + fmt.m);
  const uint32_t exp8 = (bits >> 23) & 0xFF;
  const uint32_t man = bits & 0x7FFFFF;
  if (exp8 == 0xFF) {
    if (man != 0) {  // NaN: quiet, keep the top payload bits
      if (!fmt.ieee) return sign_out | (fmt.exp_mask() << fmt.m) | fmt.man_mask();
      return sign_out | fmt.inf_code() | (1u << (fmt.m - 1)) | (man >> (23 - fmt.m));
    }
    return sign_out | (fmt.ieee ? fmt.inf_code() : fmt.max_code());
  }
  const int emin = 1 - fmt.bias();
  const int e = exp8 == 0 ? -126 : static_cast<int>(exp8) - 127;
  uint64_t r;
  if (exp8 != 0 && e >= emin) {
    // Rounding the exponent and mantissa together lets a mantissa carry bump
    // the exponent (and overflow into the inf / beyond-max range).
    const uint64_t combined = (static_cast<uint64_t>(e - emin + 1) << 23) | man;
    r = RoundShift(combined, 23 - fmt.m);
  } else {
    const uint64_t full = exp8 == 0 ? man : (man | 0x800000u);
    r = RoundShift(full, 23 - fmt.m + (emin - e));
  }
  if (r > fmt.max_code()) r = fmt.ieee ? fmt.inf_code() : fmt.max_code();
  return sign_out | static_cast<uint32_t>(r);
}

float NarrowToFloat(uint32_t code, const Format& fmt) {
  const uint32_t sign = (code >> (fmt.e + fmt.m)) & 1;
  const uint32_t exp = (code >> fmt.m) & fmt.exp_mask();
  const uint32_t man = code & fmt.man_mask();
  if (exp == fmt.exp_mask()) {
    if (fmt.ieee) {
      if (man == 0) return BitsFloat((sign << 31) | 0x7F800000u);
      return BitsFloat((sign << 31) | 0x7FC00000u | (man << (23 - fmt.m)));
    }
    if (man == fmt.man_mask()) return BitsFloat((sign << 31) | 0x7FC00000u);
  }
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), 1 - fmt.bias() - fmt.m);
    return sign ? -v : v;
  }
  return BitsFloat((sign << 31) | ((exp - fmt.bias() + 127) << 23) | (man << (23 - fmt.m)));
}

template <const Format& F>
const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) t[i] = NarrowToFloat(i, F);
    return t;
  }();
  return table;
}

// Codecs: storage type plus widen / narrow through fp32.
struct F32 {
  using T = float;
  static float Load(T v) { return v; }
  static T Store(float f) { return f; }
};
struct B16 {
  using T = uint16_t;
  static float Load(T v) { return Bf16ToFloat(v); }
  static T Store(float f) { return FloatToBf16(f); }
};
struct F16 {
  using T = uint16_t;
  static float Load(T v) { return Fp16ToFloat(v); }
  static T Store(float f) { return FloatToFp16(f); }
};
struct E4M3 {
  using T = uint8_t;
  static float Load(T v) { return Fp8Table<kE4M3>()[v]; }
  static T Store(float f) { return FloatToFp8E4M3(f); }
};
struct E5M2 {
  using T = uint8_t;
  static float Load(T v) { return Fp8Table<kE5M2>()[v]; }
  static T Store(float f) { return FloatToFp8E5M2(f); }
};

template <typename S, typename D>
void ConvertLoop(const void* src, void* dst, int64_t n) {
  const auto* s = static_cast<const typename S::T*>(src);
  auto* d = static_cast<typename D::T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = D::Store(S::Load(s[i]));
}

template <typename S>
bool ConvertFrom(const void* src, void* dst, DType dst_dtype, int64_t n) {
  switch (dst_dtype) {
    case v1::FP32:
      ConvertLoop<S, F32>(src, dst, n);
      return true;
    case v1::BF16:
      ConvertLoop<S, B16>(src, dst, n);
      return true;
    case v1::FP16:
      ConvertLoop<S, F16>(src, dst, n);
      return true;
    case v1::FP8_E4M3:
      ConvertLoop<S, E4M3>(src, dst, n);
      return true;
    case v1::FP8_E5M2:
      ConvertLoop<S, E5M2>(src, dst, n);
      return true;
    default:
      return false;
  }
}

template <typename C>
void ReduceFloat(absl::Span<const void* const> inputs, v1::ReduceOp op, void* dst, int64_t n) {
  constexpr int64_t kChunk = 2048;
  float acc[kChunk];
  const float count = static_cast<float>(inputs.size());
  auto* d = static_cast<typename C::T*>(dst);
  for (int64_t base = 0; base < n; base += kChunk) {
    const int64_t len = std::min(kChunk, n - base);
    const auto* first = static_cast<const typename C::T*>(inputs[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = C::Load(first[i]);
    for (size_t k = 1; k < inputs.size(); ++k) {
      const auto* in = static_cast<const typename C::T*>(inputs[k]) + base;
      for (int64_t i = 0; i < len; ++i) acc[i] += C::Load(in[i]);
    }
    if (op == v1::REDUCE_AVG) {
      for (int64_t i = 0; i < len; ++i) acc[i] /= count;
    }
    for (int64_t i = 0; i < len; ++i) d[base + i] = C::Store(acc[i]);
  }
}

template <typename T>
void ReduceIntSum(absl::Span<const void* const> inputs, void* dst, int64_t n) {
  auto* d = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t sum = 0;  // unsigned: wrap-around is defined
    for (const void* in : inputs) sum += static_cast<uint64_t>(static_cast<const T*>(in)[i]);
    d[i] = static_cast<T>(sum);
  }
}

}  // namespace

uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }
uint16_t FloatToFp16(float f) { return static_cast<uint16_t>(FloatToNarrow(f, kFp16)); }
float Fp16ToFloat(uint16_t h) { return NarrowToFloat(h, kFp16); }
uint8_t FloatToFp8E4M3(float f) { return static_cast<uint8_t>(FloatToNarrow(f, kE4M3)); }
float Fp8E4M3ToFloat(uint8_t b) { return Fp8Table<kE4M3>()[b]; }
uint8_t FloatToFp8E5M2(float f) { return static_cast<uint8_t>(FloatToNarrow(f, kE5M2)); }
float Fp8E5M2ToFloat(uint8_t b) { return Fp8Table<kE5M2>()[b]; }

double ReadElement(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case v1::FP32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case v1::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Bf16ToFloat(h);
    }
    case v1::FP16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Fp16ToFloat(h);
    }
    case v1::FP8_E4M3:
      return Fp8E4M3ToFloat(*p);
    case v1::FP8_E5M2:
      return Fp8E5M2ToFloat(*p);
    case v1::INT8:
      return static_cast<int8_t>(*p);
    case v1::UINT8:
    case v1::BOOL:
      return *p;
    case v1::INT32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case v1::INT64: {
      int64_t i;
      std::memcpy(&i, p, 8);
      return static_cast<double>(i);
    }
    default:
      return 0;
  }
}

bool CanConvert(DType from, DType to) {
  if (DTypeSize(from) == 0 || DTypeSize(to) == 0) return false;
  if (from == to) return true;
  return IsFloatingPoint(from) && IsFloatingPoint(to);
}

absl::Status ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                             int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("negative element count ", n));
  if (!CanConvert(src_dtype, dst_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("no conversion from ", DTypeName(src_dtype),
                                                   " to ", DTypeName(dst_dtype),
                                                   " (integer and bool convert only to "
                                                   "themselves; floats among themselves)"));
  }
  if (n == 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n * DTypeSize(src_dtype)));
    return absl::OkStatus();
  }
  bool done = false;
  switch (src_dtype) {
    case v1::FP32:
      done = ConvertFrom<F32>(src, dst, dst_dtype, n);
      break;
    case v1::BF16:
      done = ConvertFrom<B16>(src, dst, dst_dtype, n);
      break;
    case v1::FP16:
      done = ConvertFrom<F16>(src, dst, dst_dtype, n);
      break;
    case v1::FP8_E4M3:
      done = ConvertFrom<E4M3>(src, dst, dst_dtype, n);
      break;
    case v1::FP8_E5M2:
      done = ConvertFrom<E5M2>(src, dst, dst_dtype, n);
      break;
    default:
      break;
  }
  if (!done) {
    return absl::InternalError(
        absl::StrCat("unhandled conversion ", DTypeName(src_dtype), " -> ", DTypeName(dst_dtype)));
  }
  return absl::OkStatus();
}

absl::Status ReduceElements(absl::Span<const void* const> inputs, DType dtype, v1::ReduceOp op,
                            void* dst, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("negative element count ", n));
  if (inputs.empty()) return absl::InvalidArgumentError("reduce of zero inputs");
  if (op != v1::REDUCE_SUM && op != v1::REDUCE_AVG) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int>(op)));
  }
  if (IsFloatingPoint(dtype)) {
    switch (dtype) {
      case v1::FP32:
        ReduceFloat<F32>(inputs, op, dst, n);
        break;
      case v1::BF16:
        ReduceFloat<B16>(inputs, op, dst, n);
        break;
      case v1::FP16:
        ReduceFloat<F16>(inputs, op, dst, n);
        break;
      case v1::FP8_E4M3:
        ReduceFloat<E4M3>(inputs, op, dst, n);
        break;
      default:
        ReduceFloat<E5M2>(inputs, op, dst, n);
        break;
    }
    return absl::OkStatus();
  }
  if (op != v1::REDUCE_SUM || dtype == v1::BOOL || DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("reduce ", v1::ReduceOp_Name(op), " is not ",
                                                   "defined for dtype ", DTypeName(dtype)));
  }
  switch (dtype) {
    case v1::INT8:
      ReduceIntSum<int8_t>(inputs, dst, n);
      break;
    case v1::UINT8:
      ReduceIntSum<uint8_t>(inputs, dst, n);
      break;
    case v1::INT32:
      ReduceIntSum<int32_t>(inputs, dst, n);
      break;
    default:
      ReduceIntSum<int64_t>(inputs, dst, n);
      break;
  }
  return absl::OkStatus();
}

}  // namespace wsync
