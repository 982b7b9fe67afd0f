// SyncCoordinator: what trainers and workers ask of syncs under way —
// snapshots, waits, the next change, cancels, GetStatus, AwaitWriters.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

v1::SyncStatus SyncCoordinator::SnapshotLocked(const SyncRecord& sync) {
  v1::SyncStatus s = sync.status;
  if (!sync.finished()) {
    s.set_elapsed_seconds(absl::ToDoubleSeconds(absl::Now() - sync.start));
    int64_t bytes = 0;
    for (const Participant& p : sync.parts) bytes += p.bytes_done;
    s.set_bytes_done(bytes);
  }
  return s;
}

absl::StatusOr<v1::SyncStatus> SyncCoordinator::WaitSync(const std::string& sync_id,
                                                         absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(sync_id);
  if (it == syncs_.end()) return UnknownSyncLocked(sync_id);
  // Tick may prune the record while this waits: hold it.
  const std::shared_ptr<SyncRecord> sync = it->second;
  // Without a timeout the sync's own deadline bounds the wait (Tick ends it).
  const absl::Time until =
      timeout > absl::ZeroDuration() ? absl::Now() + timeout : sync->deadline + absl::Seconds(5);
  while (!sync->finished() && !shutdown_) {
    if (cv_.WaitWithDeadline(&mu_, until)) break;
  }
  return SnapshotLocked(*sync);
}

absl::StatusOr<v1::SyncStatus> SyncCoordinator::NextSyncUpdate(const std::string& sync_id,
                                                               int64_t* seen, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(sync_id);
  if (it == syncs_.end()) return UnknownSyncLocked(sync_id);
  const std::shared_ptr<SyncRecord> sync = it->second;  // see WaitSync
  while (sync->changes <= *seen && !sync->finished() && !shutdown_) {
    if (cv_.WaitWithDeadline(&mu_, until)) break;
  }
  if (shutdown_ && !sync->finished()) {
    return absl::UnavailableError(
        absl::StrCat("controller shutting down; sync '", sync_id, "' did not end"));
  }
  *seen = sync->changes;
  return SnapshotLocked(*sync);
}

absl::Status SyncCoordinator::CheckCancellableLocked(const SyncRecord& sync) {
  const v1::SyncStatus& s = sync.status;
  if (sync.finished() || !s.commit_decided()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "Cancel: sync ", s.sync_id(), " of transfer '", s.transfer(), "': the commit of version ",
      s.version(), " was decided",
      sync.decided == absl::InfinitePast()
          ? ""
          : absl::StrCat(" at ",
                         absl::FormatTime(absl::RFC3339_full, sync.decided, absl::UTCTimeZone())),
      " (every receiver staged it): it cannot be cancelled; wait for it (WaitSync)"));
}

absl::StatusOr<v1::SyncStatus> SyncCoordinator::Cancel(const std::string& sync_id,
                                                       const std::string& reason,
                                                       const TrainerCaller& caller) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(sync_id);
  if (it == syncs_.end()) {
    auto warm = CancelWarmUpLocked(sync_id, reason, caller);
    return warm.has_value() ? *std::move(warm) : UnknownSyncLocked(sync_id);
  }
  // The transfer's owner; of an unowned one, whoever started the sync.
  auto t = transfers_.find(it->second->status.transfer());
  const std::string& owner =
      t != transfers_.end() && !t->second.owner.empty() ? t->second.owner : it->second->started_by;
  if (absl::Status owned =
          CheckOwner("Cancel", it->second->status.transfer(), owner, caller, "cancel syncs of");
      !owned.ok()) {
    return owned;
  }
  if (absl::Status decided = CheckCancellableLocked(*it->second); !decided.ok()) return decided;
  FinishLocked(*it->second, v1::SYNC_CANCELLED, static_cast<int32_t>(absl::StatusCode::kCancelled),
               absl::StrCat("cancelled by the trainer", reason.empty() ? "" : ": ", reason), -1, -1,
               -1, -1);
  return SnapshotLocked(*it->second);
}

v1::GetStatusResponse SyncCoordinator::GetStatus() {
  absl::MutexLock lock(&mu_);
  v1::GetStatusResponse resp;
  for (const auto& [name, t] : transfers_) {
    v1::TransferStatus* ts = resp.add_transfers();
    ts->set_name(name);
    ts->set_source_group(t.source_group);
    ts->set_destination_group(t.destination_group);
    ts->set_last_success_version(t.last_success_version);
    ts->set_plan_key(t.plan_key);
    ts->set_generation(t.generation);
    ts->set_owner(t.owner);
    FillWarmUpLocked(t, ts->mutable_warm_up());
    if (!t.in_flight.empty()) ts->set_in_flight_version(syncs_.at(t.in_flight)->status.version());
    *ts->mutable_rollout() = t.spec.rollout();
    for (v1::ReplicaVersion& r : ServedReplicasLocked(t)) *ts->add_replicas() = std::move(r);
    auto sit = syncs_.find(t.last_sync);
    if (sit != syncs_.end()) *ts->mutable_last_sync() = SnapshotLocked(*sit->second);
  }
  const WorkerRegistry::Counts counts = workers_->CountWorkers();
  resp.set_workers_registered(counts.registered);
  resp.set_workers_alive(counts.alive);
  resp.set_plan_cache_hits(plans_->hits());
  resp.set_plan_cache_misses(plans_->misses());
  resp.set_controller_instance(config_.instance);
  return resp;
}

absl::StatusOr<v1::AwaitWritersResponse> SyncCoordinator::AwaitWriters(
    const v1::AwaitWritersRequest& req) {
  const absl::Time until = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, req.timeout_ms()));
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("controller is shutting down");
    v1::AwaitWritersResponse resp;
    auto it = syncs_.find(req.sync_id());
    // Long over: its record was dropped, or restored from the saved state
    // (an earlier instance ran it; its writers are no one's now).
    if (it == syncs_.end() || it->second->parts.empty()) return resp;
    for (int32_t w : req.workers()) {
      const Participant* found = nullptr;
      for (const Participant& p : it->second->parts) {
        if (p.worker == w) found = &p;
      }
      if (found == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "AwaitWriters: worker ", w, " takes no part in sync '", req.sync_id(), "'"));
      }
      if (!found->done && workers_->IsAlive(found->lease_id)) resp.add_pending(w);
    }
    // A lost writer wakes this wait (WorkerLost).
    if (resp.pending().empty() || cv_.WaitWithDeadline(&mu_, until)) return resp;
  }
}

}  // namespace wsync::controller
