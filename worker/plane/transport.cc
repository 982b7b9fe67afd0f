#include "worker/plane/transport.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "common/bucket_steps.h"

namespace wsync::transport {
namespace {

template <typename Request>
absl::Status CheckSide(int32_t rank, int32_t size, absl::Span<const Request> requests,
                       const char* what) {
  std::vector<std::pair<int32_t, int64_t>> keys;
  keys.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    if (r.peer < 0 || r.peer >= size) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " (tag ", r.tag, "): peer ",
                                                     r.peer, " outside [0, ", size, ")"));
    }
    if (r.peer == rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, " (tag ", r.tag, "): peer ", r.peer,
                       " is this rank; local bytes go through the data ops, not the transport"));
    }
    if (r.data == nullptr && r.bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, " (peer ", r.peer, ", tag ", r.tag, "): null data"));
    }
    if (r.step < 0 || r.step >= kMaxBucketSteps) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " (peer ", r.peer, ", tag ",
                                                     r.tag, "): step ", r.step, " outside [0, ",
                                                     kMaxBucketSteps, ")"));
    }
    keys.emplace_back(r.peer, r.tag);
  }
  std::sort(keys.begin(), keys.end());
  const auto dup = std::adjacent_find(keys.begin(), keys.end());
  if (dup != keys.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "s list peer ", dup->first, " tag ",
                                                   dup->second, " twice in one round"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRoundRequests(int32_t rank, int32_t size, absl::Span<const SendRequest> sends,
                                   absl::Span<const RecvRequest> recvs) {
  absl::Status s = CheckSide(rank, size, sends, "send");
  if (s.ok()) s = CheckSide(rank, size, recvs, "recv");
  return s;
}

int32_t LandingPartCount(int64_t list_bytes, int32_t max_parts, int64_t min_part_bytes) {
  if (max_parts <= 1 || list_bytes <= 0) return 1;
  const int64_t by_size = min_part_bytes > 0 ? list_bytes / min_part_bytes : max_parts;
  return static_cast<int32_t>(std::clamp<int64_t>(by_size, 1, max_parts));
}

int32_t LandingPartOf(int64_t offset, int64_t list_bytes, int32_t parts) {
  if (parts <= 1 || list_bytes <= 0 || offset <= 0) return 0;
  // offset * parts / list_bytes, exact (both sides of a pair must agree) and
  // without overflow (list_bytes may be near 2^63).
  const absl::uint128 part = absl::uint128(static_cast<uint64_t>(offset)) *
                             static_cast<uint64_t>(parts) / static_cast<uint64_t>(list_bytes);
  return static_cast<int32_t>(std::min<uint64_t>(absl::Uint128Low64(part), parts - 1));
}

}  // namespace wsync::transport
