// Staged syncs (docs/staging.md, "An owner holding syncs off"): the owner's
// hold and the commit that writes its live tensors, under one lock. A commit
// begins only in the critical section that finds no hold (TryBegin); a hold
// set while a commit is writing waits for it to end, bounded, and says which
// commit it waited for, or that one is still in progress. So once Hold
// returns without an error, no commit writes the live tensors until the
// owner admits syncs again, and the owner knows whether one began.
#ifndef WSYNC_WORKER_AGENT_COMMIT_LATCH_H_
#define WSYNC_WORKER_AGENT_COMMIT_LATCH_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wsync::agent {

class CommitLatch {
 public:
  // The owner's hold reason ("" admits syncs).
  std::string held() const;
  // Begins the commit of `sync_id` unless held: returns the hold reason and
  // begins nothing, or "" and counts the commit as in progress until End.
  std::string TryBegin(const std::string& sync_id);
  // The commit begun by TryBegin ended (committed or failed).
  void End();
  // Sets the hold (`reason` non-empty) or admits syncs (""). A hold set
  // while a commit is in progress waits up to `wait` (--hold_commit_wait)
  // for it to end. Returns the sync id of the last commit that began since
  // syncs were last admitted (the one it waited for, or one that began and
  // ended before the hold; "" when none did: nothing was written), or
  // DEADLINE_EXCEEDED naming the commit still writing after `wait`. The
  // hold stands either way: no later commit begins. ABORTED when syncs were
  // admitted (another Hold("")) while this hold waited: it no longer holds.
  // Admitting returns "" at once.
  absl::StatusOr<std::string> Hold(std::string reason, absl::Duration wait);
  // Runs (outside the lock) after each admission: a thread awaiting one
  // wakes. May be set while owners already call Hold.
  void SetWaker(std::function<void()> wake) {
    absl::MutexLock lock(&mu_);
    wake_ = std::move(wake);
  }
  // Test seam: runs under the lock when Hold starts waiting for a commit in
  // progress (tests order threads with it; never set in production).
  void SetHoldWaitHookForTest(std::function<void()> hook) { hold_wait_hook_ = std::move(hook); }

 private:
  std::function<void()> hold_wait_hook_;
  mutable absl::Mutex mu_;
  std::function<void()> wake_ ABSL_GUARDED_BY(mu_);
  std::string held_ ABSL_GUARDED_BY(mu_);
  std::string committing_ ABSL_GUARDED_BY(mu_);  // between TryBegin and End
  std::string last_begun_ ABSL_GUARDED_BY(mu_);  // since the last admission
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_COMMIT_LATCH_H_
