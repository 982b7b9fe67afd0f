// Element types: sizes, names, and which conversions make the wire narrower.
#ifndef WSYNC_COMMON_DTYPE_H_
#define WSYNC_COMMON_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wsync/v1/layout.pb.h"

namespace wsync {

using DType = ::wsync::v1::DType;

// Bytes per element; 0 for DTYPE_UNSPECIFIED.
int64_t DTypeSize(DType dtype);
// "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int32", "int64", "uint8", "bool".
std::string DTypeName(DType dtype);
// Accepts the short names above and the proto enum names ("BF16").
absl::StatusOr<DType> ParseDType(absl::string_view name);
bool IsFloatingPoint(DType dtype);

}  // namespace wsync

#endif  // WSYNC_COMMON_DTYPE_H_
