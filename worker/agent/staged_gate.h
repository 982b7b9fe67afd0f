// Staged syncs (docs/staging.md): where a receiver that staged a sync waits
// for the pool's decision. The controller's CommitSync or AbortSync (read on
// the assignment stream's thread), the word of the controller it registers
// with again after its stream ended (Rejoined: a restarted controller resumes
// a decided commit), a stop, or the sync's deadline decide. A stream that
// ends decides nothing by itself: the decision may have been taken and saved
// just before the controller died.
//
// Registrations are numbered (lease epochs, increasing). A sync is armed
// with the epoch its staged report goes out under; the registration of a
// later epoch decides it (Rejoined), whichever of Arm and Rejoined comes
// first: a sync armed under an epoch older than the last Rejoined one rolls
// back at once (its report went to a lease already replaced, so no
// controller can decide it). Both run under the gate's lock: no order of a
// staged report and a re-registration leaves the decision to a guess.
#ifndef WSYNC_WORKER_AGENT_STAGED_GATE_H_
#define WSYNC_WORKER_AGENT_STAGED_GATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wsync::agent {

class StagedGate {
 public:
  struct Decision {
    bool commit = false;
    std::string reason;  // why not
  };
  // What this worker held of a sync a controller lists as decided.
  enum class Held {
    kAwaiting,    // its shadow, awaiting the decision: committed now
    kCommitting,  // decided here already; its confirmation follows
    kCommitted,   // committed (Finished): confirm again
    kNothing,     // no shadow of it (rolled back, or never staged here)
    kWaiting,     // its shadow, kept: its commit wave has not started (rolling waves)
  };

  // Sync `sync_id` staged and its report goes out under lease epoch
  // `lease_epoch`: decisions for it count from now on (one before Arm is
  // kept if it was for this sync, e.g. an abort sent meanwhile; an early
  // commit only if `keep_early_commit`: a receiver armed again after its
  // owner admitted syncs drops a CommitSync heard while held, and awaits the
  // one the controller sends once its whole replica is admitted).
  void Arm(const std::string& sync_id, uint64_t lease_epoch, bool keep_early_commit = true);
  // The controller's decision for `sync_id` (ignored for another sync).
  void Commit(const std::string& sync_id);
  // Empty sync_id: whatever is armed (e.g. the worker stops).
  void Abort(const std::string& sync_id, const std::string& reason);
  // Blocks until a decision for the armed sync or `deadline` (then: no
  // commit, naming the deadline); disarms. After a commit decision the sync
  // counts as committing until Finished.
  Decision Wait(absl::Time deadline);
  // Wait without blocking: the decision (disarming, as Wait) once there is
  // one or `deadline` passed, else nothing.
  std::optional<Decision> Poll(absl::Time deadline);
  // `wake` runs (outside the gate's lock, on the deciding thread) whenever
  // a decision for the armed sync arrives: a caller that polls sleeps until
  // then. Set once, before any decision.
  void SetWaker(std::function<void()> wake);
  // The committing sync `sync_id` ended: `committed` (its live tensors hold
  // it) or its commit failed.
  void Finished(const std::string& sync_id, bool committed);
  // Registered again (lease epoch `lease_epoch`) with a controller that
  // lists `decided` (sync ids whose commit is decided and awaits this
  // worker): a sync armed under an older epoch commits if among them, else
  // rolls back naming `reason`. Returns what this worker held of each listed
  // sync, in order. An armed sync listed in `later` (decided, its commit
  // wave not started: DecidedCommit.await_commit) stays armed, awaiting its
  // CommitSync (kWaiting).
  std::vector<Held> Rejoined(uint64_t lease_epoch, const std::vector<std::string>& decided,
                             const std::string& reason, const std::vector<std::string>& later = {});

 private:
  static constexpr size_t kCommittedKept = 16;

  std::vector<Held> RejoinedLocked(uint64_t lease_epoch, const std::vector<std::string>& decided,
                                   const std::string& reason, const std::vector<std::string>& later)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the waker when `woke` (call without mu_ held).
  void Wake(bool woke);
  // Wait's end under mu_: the decision taken, the sync disarmed.
  Decision TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::function<void()> wake_;
  absl::Mutex mu_;
  std::string armed_ ABSL_GUARDED_BY(mu_);
  uint64_t armed_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejoined_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the latest Rejoined
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  Decision decision_ ABSL_GUARDED_BY(mu_);
  // A decision that came before Arm (an abort racing the staged report).
  std::string early_id_ ABSL_GUARDED_BY(mu_);
  Decision early_ ABSL_GUARDED_BY(mu_);
  std::string committing_ ABSL_GUARDED_BY(mu_);             // between Wait (commit) and Finished
  std::deque<std::string> committed_ ABSL_GUARDED_BY(mu_);  // the latest, newest last
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_STAGED_GATE_H_
