#include "controller/server/assignment_feed.h"

#include <optional>
#include <utility>

namespace wsync::controller {

absl::Status AssignmentFeed::Open(std::function<void()> wake) {
  absl::StatusOr<uint64_t> token = workers_->OpenStream(lease_id_, std::move(wake));
  if (!token.ok()) return token.status();
  token_.store(*token);
  return absl::OkStatus();
}

AssignmentFeed::Step AssignmentFeed::Next(v1::Assignment* out, absl::Status* end) {
  const uint64_t token = token_.load();
  if (token == 0) return Step::kNothing;
  absl::StatusOr<std::optional<v1::Assignment>> next =
      workers_->NextAssignment(lease_id_, token, absl::ZeroDuration());
  if (!next.ok()) {
    // The registry ended it (its token is no longer valid): nothing to close.
    uint64_t expected = token;
    token_.compare_exchange_strong(expected, 0);
    *end = next.status();
    return Step::kEnd;
  }
  if (!next->has_value()) return Step::kNothing;
  *out = **std::move(next);
  return Step::kAssignment;
}

void AssignmentFeed::Close(const std::string& why) {
  const uint64_t token = token_.exchange(0);
  if (token != 0) workers_->CloseStream(lease_id_, token, why);
}

}  // namespace wsync::controller
