// The opt-in low-latency mode's policy (--busy_poll_ms of the worker and the
// controller; docs/performance-notes.md, docs/operations.md): between syncs,
// threads on a sync's path poll instead of sleeping in the kernel, so that
// work arriving after an idle spell finds them running: no wake-up of a
// descheduled thread (a few hundred microseconds on a VM) on the path.
//
// The policy is spin-then-sleep: a poller spins for `window` after the last
// activity (Touch), then sleeps as the default mode does until the next
// activity. A window of
// absl::InfiniteDuration() spins forever (strict mode: a core per spinning
// thread, always); absl::ZeroDuration() is off (the default).
#ifndef WSYNC_COMMON_BUSY_POLL_H_
#define WSYNC_COMMON_BUSY_POLL_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace wsync {

// The window a --busy_poll_ms value asks for: -1 forever, 0 off, > 0 that
// many milliseconds. INVALID_ARGUMENT names `flag` for anything else.
absl::StatusOr<absl::Duration> BusyPollWindow(int64_t ms, absl::string_view flag);

class BusyPoll {
 public:
  explicit BusyPoll(absl::Duration window) : window_(window) { Touch(); }

  bool enabled() const { return window_ > absl::ZeroDuration(); }
  absl::Duration window() const { return window_; }
  // Activity now: the window starts again (any thread).
  void Touch();
  // True while pollers should spin: enabled and within the window of the last
  // activity (always, in strict mode).
  bool Spinning() const;
  // Between two polls: yields the core to other runnable threads (no sleep).
  static void Relax();

 private:
  const absl::Duration window_;
  std::atomic<int64_t> last_activity_ns_{0};
};

}  // namespace wsync

#endif  // WSYNC_COMMON_BUSY_POLL_H_
