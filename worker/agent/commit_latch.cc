#include "worker/agent/commit_latch.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wsync::agent {

std::string CommitLatch::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

std::string CommitLatch::TryBegin(const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  if (held_.empty()) committing_ = last_begun_ = sync_id;
  return held_;
}

void CommitLatch::End() {
  absl::MutexLock lock(&mu_);
  committing_.clear();
}

absl::StatusOr<std::string> CommitLatch::Hold(std::string reason, absl::Duration wait) {
  const bool admit = reason.empty();
  std::string began;
  std::function<void()> wake;
  {
    absl::MutexLock lock(&mu_);
    held_ = std::move(reason);
    if (admit) {
      last_begun_.clear();  // a new window: no commit began in it yet
      wake = wake_;
    } else {
      began = last_begun_;
      if (!committing_.empty()) {
        if (hold_wait_hook_) hold_wait_hook_();
        auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return committing_.empty(); };
        const bool ended_in_time = mu_.AwaitWithTimeout(absl::Condition(&ended), wait);
        if (held_.empty()) {  // admitted meanwhile, whether or not the commit ended
          return absl::AbortedError(absl::StrCat(
              "hold: syncs were admitted while this hold waited for the commit of sync ", began,
              " to end; nothing is held now"));
        }
        if (!ended_in_time) {
          return absl::DeadlineExceededError(absl::StrCat(
              "hold: the commit of sync ", committing_,
              " began before the hold and still writes the live tensors after ",
              absl::FormatDuration(wait),
              " (--hold_commit_wait); held from now on, its outcome follows as COMMITTED or "
              "FINISHED"));
        }
      }
    }
  }
  if (wake) wake();
  return began;
}

}  // namespace wsync::agent
