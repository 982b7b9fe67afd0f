// Staged syncs (docs/staging.md): where a receiver that staged a sync waits
// for the pool's decision. The controller's CommitSync or AbortSync (read on
// the assignment stream's thread), an abort of the lease (its stream ended:
// the controller is gone or forgot it) or the sync's deadline decide.
#ifndef WSYNC_WORKER_AGENT_STAGED_GATE_H_
#define WSYNC_WORKER_AGENT_STAGED_GATE_H_

#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wsync::agent {

class StagedGate {
 public:
  struct Decision {
    bool commit = false;
    std::string reason;  // why not
  };

  // Sync `sync_id` staged: decisions for it count from now on (one before
  // Arm is kept if it was for this sync, e.g. an abort sent meanwhile).
  void Arm(const std::string& sync_id);
  // The controller's decision for `sync_id` (ignored for another sync).
  void Commit(const std::string& sync_id);
  // Empty sync_id: whatever is armed (the lease ended).
  void Abort(const std::string& sync_id, const std::string& reason);
  // Blocks until a decision for the armed sync or `deadline` (then: no
  // commit, naming the deadline); disarms.
  Decision Wait(absl::Time deadline);

 private:
  absl::Mutex mu_;
  std::string armed_ ABSL_GUARDED_BY(mu_);
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  Decision decision_ ABSL_GUARDED_BY(mu_);
  // A decision that came before Arm (an abort racing the staged report).
  std::string early_id_ ABSL_GUARDED_BY(mu_);
  Decision early_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_STAGED_GATE_H_
