#include "common/dtype.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace wsync {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case v1::FP32: return 4;
    case v1::BF16: return 2;
    case v1::FP16: return 2;
    case v1::FP8_E4M3: return 1;
    case v1::FP8_E5M2: return 1;
    case v1::INT8: return 1;
    case v1::INT32: return 4;
    case v1::INT64: return 8;
    case v1::UINT8: return 1;
    case v1::BOOL: return 1;
    default: return 0;
  }
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case v1::FP32: return "fp32";
    case v1::BF16: return "bf16";
    case v1::FP16: return "fp16";
    case v1::FP8_E4M3: return "fp8_e4m3";
    case v1::FP8_E5M2: return "fp8_e5m2";
    case v1::INT8: return "int8";
    case v1::INT32: return "int32";
    case v1::INT64: return "int64";
    case v1::UINT8: return "uint8";
    case v1::BOOL: return "bool";
    default: return "unspecified";
  }
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (int v = v1::DType_MIN; v <= v1::DType_MAX; ++v) {
    if (!v1::DType_IsValid(v) || v == v1::DTYPE_UNSPECIFIED) continue;
    const auto dtype = static_cast<DType>(v);
    if (lower == DTypeName(dtype) || lower == absl::AsciiStrToLower(v1::DType_Name(dtype))) {
      return dtype;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name,
      "'; expected one of fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8, int32, int64, uint8, bool"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == v1::FP32 || dtype == v1::BF16 || dtype == v1::FP16 || dtype == v1::FP8_E4M3 ||
         dtype == v1::FP8_E5M2;
}

}  // namespace wsync
