// WorkerAgent: the receiver's half of a staged sync's two phases
// (docs/staging.md).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/agent/agent.h"

namespace wsync::agent {
namespace {

// How long past the sync's deadline a staged receiver waits for the
// decision: the controller fails a sync at its deadline plus its
// --failure_grace and then sends the abort.
constexpr absl::Duration kDecisionSlack = absl::Seconds(5);

}  // namespace

int64_t WorkerAgent::Applied(const std::string& transfer) {
  absl::MutexLock lock(&mu_);
  auto it = applied_.find(transfer);
  return it == applied_.end() ? 0 : it->second;
}

void WorkerAgent::FinishStaged(const v1::SyncAssignment& a, const std::string& lease_id,
                               v1::ReportResultRequest r) {
  const int64_t before = Applied(a.transfer());
  v1::SyncEvent staged = EventOf(a, v1::SyncEvent::STAGED);
  staged.set_serving_version(before);
  Publish(staged);
  gate_.Arm(a.sync_id());
  Report(std::move(r), lease_id);
  // The stream may have ended between the run and Arm (its abort found
  // nothing armed): a lease no longer ours decides at once.
  if (lease() != lease_id) gate_.Abort(a.sync_id(), "lease lost before the commit");
  const StagedGate::Decision d =
      gate_.Wait(absl::FromUnixMillis(a.deadline_unix_ms()) + kDecisionSlack);

  v1::ReportResultRequest done;
  done.set_sync_id(a.sync_id());
  done.set_round(-1);
  done.set_op(-1);
  done.set_peer(-1);
  if (!d.commit) {
    runner_.DiscardStaged();
    spdlog::warn("[worker {}] sync {} rolled back (live tensors stay on version {}): {}",
                 a.transfer(), a.sync_id(), before, d.reason);
    v1::SyncEvent rolled = EventOf(a, v1::SyncEvent::ROLLED_BACK);
    rolled.set_serving_version(before);
    rolled.set_error(d.reason);
    Publish(rolled);
    done.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
    done.set_message(
        absl::StrCat("rolled back, the live tensors kept version ", before, ": ", d.reason));
    Report(std::move(done), lease_id);
    PublishEnd(a, /*ok=*/false, absl::StrCat("rolled back: ", d.reason), /*untouched=*/true);
    return;
  }
  v1::SyncEvent commit = EventOf(a, v1::SyncEvent::COMMIT);
  commit.set_serving_version(before);
  Publish(commit);
  const absl::Time t = absl::Now();
  const absl::Status s = runner_.CommitStaged();
  done.set_commit_seconds(absl::ToDoubleSeconds(absl::Now() - t));
  if (!s.ok()) {
    // Decided pool-wide, failed here: the live tensors are partly written.
    spdlog::error("[worker {}] sync {}: commit failed: {}", a.transfer(), a.sync_id(),
                  std::string(s.message()));
    done.set_code(static_cast<int32_t>(s.code()));
    done.set_message(
        absl::StrCat("commit failed, the live tensors are partly written: ", s.message()));
    Report(std::move(done), lease_id);
    PublishEnd(a, /*ok=*/false, absl::StrCat("commit failed: ", s.message()),
               /*untouched=*/false);
    return;
  }
  {
    // Before the report: whoever learns of the commit sees this version.
    absl::MutexLock lock(&mu_);
    last_version_ = std::max(last_version_, a.version());
    int64_t& applied = applied_[a.transfer()];
    applied = std::max(applied, a.version());
  }
  v1::SyncEvent committed = EventOf(a, v1::SyncEvent::COMMITTED);
  committed.set_serving_version(a.version());
  Publish(committed);
  done.set_committed(true);
  Report(std::move(done), lease_id);
  PublishEnd(a, /*ok=*/true, "", /*untouched=*/false);
}

}  // namespace wsync::agent
