// SyncCoordinator: what survives a restart (StateStore) and what a restarted
// controller says about syncs it no longer knows.
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {
namespace {

// Finished syncs whose outcome is saved (the newest).
constexpr size_t kSavedSyncs = 64;

// The number after '#' in a sync id ("<transfer>@<version>#<n>"); 0 if none.
uint64_t SyncNumber(const std::string& sync_id) {
  const size_t hash = sync_id.rfind('#');
  uint64_t n = 0;
  if (hash == std::string::npos || !absl::SimpleAtoi(sync_id.substr(hash + 1), &n)) return 0;
  return n;
}

}  // namespace

void SyncCoordinator::Restore(const v1::ControllerState& state) {
  absl::MutexLock lock(&mu_);
  for (const v1::TransferState& ts : state.transfers()) {
    Transfer& t = transfers_[ts.name()];
    t.name = ts.name();
    t.source_group = ts.source_group();
    t.destination_group = ts.destination_group();
    t.spec = ts.spec();
    ++t.definition;  // nothing bound to an earlier definition is reused
    prepared_.erase(t.name);
    t.last_success_version = ts.last_success_version();
    t.plan_key = ts.plan_key();
    t.last_sync = ts.last_sync();
    t.owner = ts.owner();  // "" from a file saved before owners: claimed on first use
    t.warm_up_enabled = config_.warm_up_on_define;  // warmed once its workers register
    t.served.clear();                               // none in files saved before session 16
    for (const v1::ServedRankState& r : ts.served()) {
      Transfer::ServedRank& served = t.served[r.rank()];
      served.version = r.version();
      served.instance = r.instance();
      served.replica = r.replica();
      served.uncommitted = r.uncommitted();
    }
    ExportServedLocked(t);
    if (metrics_ != nullptr) {
      metrics_->TransferRestored(t.name, t.last_success_version,
                                 absl::FromUnixMillis(state.saved_unix_ms()));
    }
  }
  for (const v1::SyncStatus& s : state.recent_syncs()) {
    auto sync = std::make_shared<SyncRecord>();
    sync->status = s;
    sync->start = absl::Now() - absl::Seconds(s.elapsed_seconds());
    sync->deadline = sync->start;
    syncs_[s.sync_id()] = std::move(sync);
    sync_order_.push_back(s.sync_id());
  }
  RestoreDecidedLocked(state);
  // Each transfer may have started one sync since the last save (its
  // outcome would have been saved): ids stay unique past those.
  next_id_ = std::max<uint64_t>(next_id_, state.next_sync_id() + transfers_.size() + 1);
  first_id_ = next_id_;
}

absl::Status SyncCoordinator::PersistLocked() {
  if (store_ == nullptr) return absl::OkStatus();
  const absl::Time start = absl::Now();  // encoding included
  std::string payload;
  for (auto& [name, t] : transfers_) {
    if (t.spec_encoded == nullptr || t.spec_encoded_definition != t.definition) {
      v1::TransferState spec_only;
      *spec_only.mutable_spec() = t.spec;
      t.spec_encoded = std::make_shared<const std::string>(spec_only.SerializeAsString());
      t.spec_encoded_definition = t.definition;
    }
    v1::TransferState ts;  // all but the spec
    ts.set_name(name);
    ts.set_source_group(t.source_group);
    ts.set_destination_group(t.destination_group);
    ts.set_last_success_version(t.last_success_version);
    ts.set_plan_key(t.plan_key);
    ts.set_last_sync(t.last_sync);
    ts.set_owner(t.owner);
    // What each destination rank serves (sync_rollout.cc): saved with the
    // decided commits and every outcome, so a restarted controller reports
    // and bounds (max_staleness) the same versions.
    for (const auto& [rank, served] : t.served) {
      v1::ServedRankState* out = ts.add_served();
      out->set_rank(rank);
      out->set_version(served.version);
      out->set_instance(served.instance);
      out->set_replica(served.replica);
      out->set_uncommitted(served.uncommitted);
    }
    AppendTransferState(*t.spec_encoded, ts.SerializeAsString(), &payload);
  }
  v1::ControllerState state;  // all but the transfers
  std::vector<const v1::SyncStatus*> recent;
  for (auto it = sync_order_.rbegin(); it != sync_order_.rend() && recent.size() < kSavedSyncs;
       ++it) {
    auto sit = syncs_.find(*it);
    if (sit != syncs_.end() && sit->second->finished()) recent.push_back(&sit->second->status);
  }
  for (auto it = recent.rbegin(); it != recent.rend(); ++it) *state.add_recent_syncs() = **it;
  SaveDecidedLocked(&state);
  state.set_next_sync_id(next_id_);
  state.set_saved_by_instance(config_.instance);
  state.set_saved_unix_ms(absl::ToUnixMillis(absl::Now()));
  state.AppendToString(&payload);
  const absl::Status st = store_->SaveSerialized(std::move(payload));
  if (metrics_ != nullptr)
    metrics_->StateSaved(st.ok(), absl::ToDoubleSeconds(absl::Now() - start));
  if (!st.ok()) {
    spdlog::error(
        "[controller] saving the controller state to {} failed ({}): a restart now "
        "would forget the versions delivered since the last save",
        store_->path(), st.ToString());
  }
  return st;
}

absl::Status SyncCoordinator::UnknownSyncLocked(const std::string& sync_id) {
  const uint64_t n = SyncNumber(sync_id);
  if (first_id_ > 0 && n > 0 && n < first_id_) {
    return absl::NotFoundError(
        absl::StrCat("unknown sync '", sync_id,
                     "': it was started by an earlier controller instance that "
                     "stopped before the sync ended; this instance (",
                     config_.instance,
                     ") restarted from its saved state and does not know its outcome (GetStatus's "
                     "last_success_version tells whether a version was delivered)"));
  }
  return absl::NotFoundError(absl::StrCat("unknown sync '", sync_id, "'"));
}

}  // namespace wsync::controller
