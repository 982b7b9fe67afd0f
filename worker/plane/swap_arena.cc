#include "worker/plane/swap_arena.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace wsync::plane {

std::string SwapArena::Describe() const {
  return absl::StrFormat("%s arena '%s' (%d bytes at %p)", kind(), name_, bytes_, base_);
}

bool SwapArena::Contains(const void* data, int64_t bytes) const {
  if (bytes < 0) return false;
  const auto begin = reinterpret_cast<uintptr_t>(base_);
  const auto p = reinterpret_cast<uintptr_t>(data);
  if (p < begin) return false;
  const uint64_t offset = p - begin;
  return offset <= static_cast<uint64_t>(bytes_) &&
         static_cast<uint64_t>(bytes) <= static_cast<uint64_t>(bytes_) - offset;
}

absl::StatusOr<int64_t> RoundArenaBytes(int64_t bytes, int64_t granularity,
                                        const std::string& what) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": an arena needs a positive size, got ", bytes, " bytes"));
  }
  if (granularity <= 0) {
    return absl::InternalError(
        absl::StrCat(what, ": allocation granularity ", granularity, " is not positive"));
  }
  const int64_t rest = bytes % granularity;
  if (rest == 0) return bytes;
  if (bytes > std::numeric_limits<int64_t>::max() - (granularity - rest)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes, " bytes rounded up to ",
                                                   granularity, "-byte granules overflow int64"));
  }
  return bytes + (granularity - rest);
}

}  // namespace wsync::plane
