#include "common/busy_poll.h"

#include <sched.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync {

absl::StatusOr<absl::Duration> BusyPollWindow(int64_t ms, absl::string_view flag) {
  if (ms == -1) return absl::InfiniteDuration();
  if (ms >= 0) return absl::Milliseconds(ms);
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " must be -1 (spin forever), 0 (off) or a spin window in milliseconds > 0, got ", ms));
}

void BusyPoll::Touch() {
  if (enabled()) last_activity_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
}

bool BusyPoll::Spinning() const {
  if (!enabled()) return false;
  if (window_ == absl::InfiniteDuration()) return true;
  const int64_t since =
      absl::GetCurrentTimeNanos() - last_activity_ns_.load(std::memory_order_relaxed);
  return since < absl::ToInt64Nanoseconds(window_);
}

void BusyPoll::Relax() {
  // Never sleeps, but hands the core to any other runnable thread first: a
  // spinner on a machine with fewer free cores than spinners must not delay
  // the threads that do the sync's work.
  sched_yield();
}

}  // namespace wsync
