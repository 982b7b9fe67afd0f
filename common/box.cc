#include "common/box.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wsync {

int64_t Product(absl::Span<const int64_t> v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

std::string DimsString(absl::Span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

int64_t BoxNd::NumElements() const { return Product(length); }

bool BoxNd::Contains(const BoxNd& other) const {
  if (other.rank() != rank()) return false;
  for (int d = 0; d < rank(); ++d) {
    if (other.offset[d] < offset[d] || other.offset[d] + other.length[d] > offset[d] + length[d]) {
      return false;
    }
  }
  return true;
}

std::string BoxNd::ToString() const {
  std::string s = "[";
  for (int d = 0; d < rank(); ++d) {
    absl::StrAppend(&s, d ? ", " : "", offset[d], ":", offset[d] + length[d]);
  }
  return s + "]";
}

std::optional<BoxNd> Intersect(const BoxNd& a, const BoxNd& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  BoxNd out;
  out.offset.resize(a.rank());
  out.length.resize(a.rank());
  for (int d = 0; d < a.rank(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.length[d], b.offset[d] + b.length[d]);
    if (hi <= lo) return std::nullopt;
    out.offset[d] = lo;
    out.length[d] = hi - lo;
  }
  return out;
}

DimVector RowMajorStrides(absl::Span<const int64_t> shape) {
  DimVector strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

}  // namespace wsync
