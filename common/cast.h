// Host element conversions between the wire dtypes, and the reduce helpers
// the host data ops use. The rounding rules here are the reference every
// device implementation (CUDA kernels) must match bit for bit:
//   * fp32 -> bf16 / fp16 / fp8: round to nearest, ties to even.
//   * NaN stays NaN (sign kept, quiet bit set; payload truncated).
//   * bf16, fp16, fp8 e5m2: overflow rounds to +-inf (IEEE behaviour).
//   * fp8 e4m3fn has no inf: overflow and +-inf saturate to +-448.
//   * Narrow -> narrow conversions go through fp32 (exact for every source
//     value), so they round once.
//   * Integers and bool convert only to themselves; mixing them with floats is
//     an error, never a silent reinterpretation.
#ifndef WSYNC_COMMON_CAST_H_
#define WSYNC_COMMON_CAST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace wsync {

uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);
uint8_t FloatToFp8E4M3(float f);
float Fp8E4M3ToFloat(uint8_t b);
uint8_t FloatToFp8E5M2(float f);
float Fp8E5M2ToFloat(uint8_t b);

// One element of `dtype` at `p` widened to double (exact for every dtype but
// int64 beyond 2^53); 0 for an unsupported dtype.
double ReadElement(DType dtype, const uint8_t* p);

// Whether ConvertElements supports `from` -> `to`.
bool CanConvert(DType from, DType to);

// Converts n contiguous elements. Same dtype is a memcpy. src and dst must
// not overlap unless the dtypes are equal and src == dst.
absl::Status ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                             int64_t n);

// dst[i] = op over k of inputs[k][i], all n-element contiguous arrays in
// `dtype`. Float dtypes: inputs are widened to fp32 and summed in fp32 in the
// order given; AVG then divides by inputs.size() in fp32; the result is
// rounded once to `dtype`. Integer dtypes: SUM wraps (two's complement); AVG
// is an error; bool is an error. dst may alias inputs[0].
absl::Status ReduceElements(absl::Span<const void* const> inputs, DType dtype, v1::ReduceOp op,
                            void* dst, int64_t n);

}  // namespace wsync

#endif  // WSYNC_COMMON_CAST_H_
