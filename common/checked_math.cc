#include "common/checked_math.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wsync {
namespace {

absl::Status Negative(absl::string_view what, absl::string_view name, int64_t v) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " ", v, " is negative"));
}

}  // namespace

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, absl::string_view what) {
  if (a < 0 || b < 0) return Negative(what, "operand", a < 0 ? a : b);
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a, " + ", b, " overflows 64-bit sizes"));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view what) {
  if (a < 0 || b < 0) return Negative(what, "operand", a < 0 ? a : b);
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a, " * ", b, " overflows 64-bit sizes"));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape,
                                           absl::string_view what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape [", absl::StrJoin(shape, ", "),
                                                     "] has a negative dimension"));
    }
    if (__builtin_mul_overflow(n, d, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape [", absl::StrJoin(shape, ", "), "] overflows 64-bit sizes"));
    }
  }
  return n;
}

absl::StatusOr<int64_t> CheckedBytes(absl::Span<const int64_t> shape, int64_t elem_size,
                                     absl::string_view what) {
  absl::StatusOr<int64_t> n = CheckedNumElements(shape, what);
  if (!n.ok()) return n.status();
  if (elem_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": element size ", elem_size));
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(*n, elem_size, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape [", absl::StrJoin(shape, ", "),
                                                   "] of ", elem_size,
                                                   "-byte elements overflows 64-bit sizes"));
  }
  return bytes;
}

absl::Status RangeWithin(int64_t offset, int64_t size, int64_t limit, absl::string_view what) {
  if (offset < 0) return Negative(what, "offset", offset);
  if (size < 0) return Negative(what, "size", size);
  // offset + size <= limit, without forming the sum.
  if (limit < 0 || offset > limit || size > limit - offset) {
    return absl::OutOfRangeError(
        absl::StrCat(what, ": range [", offset, ", +", size, ") lies outside [0, ", limit, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StridedExtent(absl::Span<const int64_t> shape,
                                      absl::Span<const int64_t> strides, int64_t elem_size,
                                      absl::string_view what) {
  if (shape.size() != strides.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape of rank ", shape.size(), " but ", strides.size(), " strides"));
  }
  if (elem_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": element size ", elem_size));
  }
  int64_t last = 0;
  bool empty = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || strides[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": negative size or stride (shape [",
                                                     absl::StrJoin(shape, ", "), "], strides [",
                                                     absl::StrJoin(strides, ", "), "])"));
    }
    int64_t step = 0;
    if (shape[d] == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(shape[d] - 1, strides[d], &step) ||
               __builtin_add_overflow(last, step, &last)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the extent of shape [", absl::StrJoin(shape, ", "), "] with strides [",
          absl::StrJoin(strides, ", "), "] overflows 64-bit sizes"));
    }
  }
  if (empty) return 0;
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, elem_size, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the extent of shape [", absl::StrJoin(shape, ", "), "] with strides [",
        absl::StrJoin(strides, ", "), "] of ", elem_size, "-byte elements overflows 64-bit sizes"));
  }
  return bytes;
}

}  // namespace wsync
