#include "worker/agent/staged_gate.h"

namespace wsync::agent {

void StagedGate::Arm(const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  armed_ = sync_id;
  decided_ = false;
  decision_ = Decision();
  if (early_id_ == sync_id) {
    decided_ = true;
    decision_ = early_;
  }
  early_id_.clear();
}

void StagedGate::Commit(const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  if (armed_ != sync_id) {
    early_id_ = sync_id;
    early_ = Decision{true, ""};
    return;
  }
  if (decided_) return;
  decided_ = true;
  decision_ = Decision{true, ""};
}

void StagedGate::Abort(const std::string& sync_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!sync_id.empty() && armed_ != sync_id) {
    early_id_ = sync_id;
    early_ = Decision{false, reason};
    return;
  }
  if (armed_.empty() || decided_) return;
  decided_ = true;
  decision_ = Decision{false, reason};
}

StagedGate::Decision StagedGate::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&decided_), deadline);
  Decision d =
      decided_ ? decision_ : Decision{false, "no commit decision before the sync's deadline"};
  armed_.clear();
  decided_ = false;
  return d;
}

}  // namespace wsync::agent
