// N-dimensional boxes in a tensor's global coordinates.
#ifndef WSYNC_COMMON_BOX_H_
#define WSYNC_COMMON_BOX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace wsync {

// Per-dim values of a box or a view, inline up to 4 dims (no heap array per
// fragment; docs/performance-notes.md).
using DimVector = absl::InlinedVector<int64_t, 4>;

struct BoxNd {
  DimVector offset;
  DimVector length;

  int rank() const { return static_cast<int>(offset.size()); }
  int64_t NumElements() const;
  bool Empty() const { return NumElements() == 0; }
  bool Contains(const BoxNd& other) const;
  bool operator==(const BoxNd& o) const { return offset == o.offset && length == o.length; }
  bool operator!=(const BoxNd& o) const { return !(*this == o); }
  bool operator<(const BoxNd& o) const {
    return offset != o.offset ? offset < o.offset : length < o.length;
  }
  // "[0:4, 8:16]" (half-open ranges per dim).
  std::string ToString() const;
};

// The common region of two boxes of the same rank; nullopt when they do not
// overlap (or share no element).
std::optional<BoxNd> Intersect(const BoxNd& a, const BoxNd& b);

// Row-major element strides of a contiguous array of this shape.
DimVector RowMajorStrides(absl::Span<const int64_t> shape);

int64_t Product(absl::Span<const int64_t> v);

// "[4, 8, 16]": a shape or any list of per-dim values, for messages.
std::string DimsString(absl::Span<const int64_t> dims);

}  // namespace wsync

#endif  // WSYNC_COMMON_BOX_H_
