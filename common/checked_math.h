// Overflow-safe size / offset / extent arithmetic for values that cross a
// trust boundary (owner registrations, peer buffer lists, plan parts, layout
// specs, descriptor batches). Every helper refuses negative inputs where a
// size is meant and any int64 overflow, with an INVALID_ARGUMENT (or, for
// RangeWithin, OUT_OF_RANGE) status whose message starts with `what` and
// names the operands, so the caller's error says which tensor / field failed.
// Use these instead of `a + b > limit` or `n * size` on untrusted int64s.
#ifndef WSYNC_COMMON_CHECKED_MATH_H_
#define WSYNC_COMMON_CHECKED_MATH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace wsync {

// a + b, both >= 0.
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, absl::string_view what);
// a * b, both >= 0.
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view what);

// The product of `shape` (every dimension >= 0; 1 for rank 0).
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape, absl::string_view what);
// CheckedNumElements(shape) * elem_size (elem_size > 0).
absl::StatusOr<int64_t> CheckedBytes(absl::Span<const int64_t> shape, int64_t elem_size,
                                     absl::string_view what);

// OK iff offset >= 0, size >= 0 and offset + size <= limit, computed without
// overflow (OUT_OF_RANGE otherwise; INVALID_ARGUMENT for negative values).
absl::Status RangeWithin(int64_t offset, int64_t size, int64_t limit, absl::string_view what);

// Bytes a strided view spans from its first element: ((sum over dims of
// (shape[d] - 1) * strides[d]) + 1) * elem_size, or 0 when a dimension is 0.
// Shapes and strides (in elements) must be >= 0 and of equal rank.
absl::StatusOr<int64_t> StridedExtent(absl::Span<const int64_t> shape,
                                      absl::Span<const int64_t> strides, int64_t elem_size,
                                      absl::string_view what);

}  // namespace wsync

#endif  // WSYNC_COMMON_CHECKED_MATH_H_
