#include "worker/agent/staged_gate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace wsync::agent {

void StagedGate::Arm(const std::string& sync_id, uint64_t lease_epoch, bool keep_early_commit) {
  absl::MutexLock lock(&mu_);
  armed_ = sync_id;
  armed_epoch_ = lease_epoch;
  decided_ = false;
  decision_ = Decision();
  if (early_id_ == sync_id && (keep_early_commit || !early_.commit)) {
    decided_ = true;
    decision_ = early_;
  }
  early_id_.clear();
  if (!decided_ && lease_epoch < rejoined_epoch_) {
    // The registration that replaced its lease was heard before this sync
    // was armed: it could not list it, and its staged report goes to a
    // lease that no longer exists.
    decided_ = true;
    decision_ = Decision{false, absl::StrCat("registered again (lease epoch ", rejoined_epoch_,
                                             ") before its staged report (epoch ", lease_epoch,
                                             ") could reach the controller")};
  }
}

void StagedGate::SetWaker(std::function<void()> wake) { wake_ = std::move(wake); }

void StagedGate::Wake(bool woke) {
  if (woke && wake_) wake_();
}

void StagedGate::Commit(const std::string& sync_id) {
  bool woke = false;
  {
    absl::MutexLock lock(&mu_);
    if (armed_ != sync_id) {
      early_id_ = sync_id;
      early_ = Decision{true, ""};
    } else if (!decided_) {
      decided_ = woke = true;
      decision_ = Decision{true, ""};
    }
  }
  Wake(woke);
}

void StagedGate::Abort(const std::string& sync_id, const std::string& reason) {
  bool woke = false;
  {
    absl::MutexLock lock(&mu_);
    if (!sync_id.empty() && armed_ != sync_id) {
      early_id_ = sync_id;
      early_ = Decision{false, reason};
    } else if (!armed_.empty() && !decided_) {
      decided_ = woke = true;
      decision_ = Decision{false, reason};
    }
  }
  Wake(woke);
}

StagedGate::Decision StagedGate::TakeLocked() {
  Decision d =
      decided_ ? decision_ : Decision{false, "no commit decision before the sync's deadline"};
  if (d.commit) committing_ = armed_;
  armed_.clear();
  decided_ = false;
  return d;
}

StagedGate::Decision StagedGate::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&decided_), deadline);
  return TakeLocked();
}

std::optional<StagedGate::Decision> StagedGate::Poll(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!decided_ && absl::Now() < deadline) return std::nullopt;
  return TakeLocked();
}

void StagedGate::Finished(const std::string& sync_id, bool committed) {
  absl::MutexLock lock(&mu_);
  if (committing_ == sync_id) committing_.clear();
  if (!committed) return;
  committed_.push_back(sync_id);
  if (committed_.size() > kCommittedKept) committed_.pop_front();
}

std::vector<StagedGate::Held> StagedGate::Rejoined(uint64_t lease_epoch,
                                                   const std::vector<std::string>& decided,
                                                   const std::string& reason,
                                                   const std::vector<std::string>& later) {
  std::vector<Held> held;
  bool woke = false;
  {
    absl::MutexLock lock(&mu_);
    const bool was_decided = decided_;
    held = RejoinedLocked(lease_epoch, decided, reason, later);
    woke = decided_ && !was_decided;
  }
  Wake(woke);
  return held;
}

std::vector<StagedGate::Held> StagedGate::RejoinedLocked(uint64_t lease_epoch,
                                                         const std::vector<std::string>& decided,
                                                         const std::string& reason,
                                                         const std::vector<std::string>& later) {
  rejoined_epoch_ = std::max(rejoined_epoch_, lease_epoch);
  // Only a sync staged under an older lease awaits this registration's word.
  const bool awaits = !armed_.empty() && armed_epoch_ < lease_epoch;
  std::vector<Held> held;
  bool armed_listed = false;
  for (const std::string& id : decided) {
    if (awaits && id == armed_) {
      armed_listed = true;
      if (!decided_ && std::find(later.begin(), later.end(), id) != later.end()) {
        held.push_back(Held::kWaiting);
      } else if (!decided_) {
        decided_ = true;
        decision_ = Decision{true, ""};
        held.push_back(Held::kAwaiting);
      } else {
        held.push_back(decision_.commit ? Held::kCommitting : Held::kNothing);
      }
    } else if (id == committing_) {
      held.push_back(Held::kCommitting);
    } else if (std::find(committed_.begin(), committed_.end(), id) != committed_.end()) {
      held.push_back(Held::kCommitted);
    } else {
      held.push_back(Held::kNothing);
    }
  }
  if (awaits && !armed_listed && !decided_) {
    decided_ = true;
    decision_ = Decision{false, reason};
  }
  return held;
}

}  // namespace wsync::agent
