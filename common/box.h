// N-dimensional boxes in a tensor's global coordinates.
#ifndef WSYNC_COMMON_BOX_H_
#define WSYNC_COMMON_BOX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace wsync {

struct BoxNd {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;

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
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape);

int64_t Product(const std::vector<int64_t>& v);

}  // namespace wsync

#endif  // WSYNC_COMMON_BOX_H_
