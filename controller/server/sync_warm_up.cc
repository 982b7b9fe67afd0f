// SyncCoordinator: warm-ups (docs/warm-up.md). A warm-up is a sync's
// dispatch without a version: every worker of the transfer gets its routed
// part with SyncAssignment.warm_up and prepares what the sync would (binding,
// peer mappings, the transport of the current generation, a message with
// every peer, staging), then reports. It changes no version, no serving
// state and no delivery record; a sync started meanwhile waits for it.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

bool SyncCoordinator::WarmUpDueLocked(const Transfer& t, uint64_t epoch) {
  if (!t.warm_up_enabled || t.warm.running() || !t.in_flight.empty()) return false;
  if (t.warm.definition != t.definition || t.warm.epoch != epoch) return true;
  // A failed sync broke the transport its workers kept: warm a new one once
  // (a failed warm-up waits for a change of the workers instead).
  return t.generation_broken && t.warm.state == v1::WARM_UP_WARM;
}

void SyncCoordinator::WarmUpTick() {
  const uint64_t epoch = workers_->epoch();
  std::vector<std::string> due;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto& [name, t] : transfers_) {
      if (t.warm.running() && now >= t.warm.deadline + config_.failure_grace) {
        std::vector<std::string> silent;
        for (size_t w = 0; w < t.warm.workers.size(); ++w) {
          if (t.warm.workers[w].done) continue;
          silent.push_back(
              absl::StrCat(workers_->Describe(t.warm.workers[w].lease_id), " [worker ", w, "]"));
        }
        EndWarmUpLocked(t, false,
                        absl::StrCat("not reported by its deadline (--warm_up_deadline ",
                                     absl::FormatDuration(config_.warm_up_deadline),
                                     "): ", absl::StrJoin(silent, ", ")));
      }
      auto sit = t.in_flight.empty() ? syncs_.end() : syncs_.find(t.in_flight);
      if (sit != syncs_.end() && sit->second->held != nullptr && !sit->second->finished() &&
          now >= sit->second->deadline) {
        SyncRecord& sync = *sit->second;
        std::vector<std::string> leases;
        for (const Participant& p : sync.parts) leases.push_back(p.lease_id);
        FinishLocked(
            sync, v1::SYNC_FAILED, static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded),
            absl::StrCat("sync deadline of ", absl::FormatDuration(sync.deadline - sync.start),
                         " passed while it waited for warm-up ", WarmingUpLocked(leases),
                         " of its workers (nothing was sent to them)"),
            -1, -1, -1, -1);
      }
      if (WarmUpDueLocked(t, epoch)) due.push_back(name);
    }
  }
  for (const std::string& name : due) StartWarmUp(name);
}

std::string SyncCoordinator::StartWarmUp(const std::string& name) {
  // Read before anything is bound, as StartSync does.
  const uint64_t epoch = workers_->epoch();
  std::shared_ptr<const Prepared> reuse;
  std::optional<Transfer> defined;
  uint64_t definition = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(name);
    if (it == transfers_.end() || !WarmUpDueLocked(it->second, epoch)) return "";
    definition = it->second.definition;
    reuse = ReusableLocked(name, definition, epoch);
    if (reuse == nullptr) defined = it->second;
  }
  std::shared_ptr<Prepared> fresh;
  absl::Status prepared = absl::OkStatus();
  if (reuse != nullptr) {
    fresh = std::make_shared<Prepared>(*reuse);
  } else {
    auto p = Prepare(*defined, epoch);  // unlocked: binding, planning (cached), routing
    if (p.ok()) {
      fresh = *std::move(p);
    } else {
      prepared = p.status();
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(name);
  // Redefined or started meanwhile: the next tick looks again.
  if (it == transfers_.end() || it->second.definition != definition ||
      !WarmUpDueLocked(it->second, epoch)) {
    return "";
  }
  Transfer& t = it->second;
  t.warm.definition = definition;
  t.warm.epoch = epoch;
  bool reroute = false;
  absl::StatusOr<std::vector<std::string>> leases =
      prepared.ok() ? CheckWorkersLocked(fresh->resolved, fresh->plan, &reroute)
                    : absl::StatusOr<std::vector<std::string>>(prepared);
  if (leases.ok() && reroute) {
    fresh->dispatch = Decide(t.name, fresh->resolved, fresh->plan);
    fresh->parts = Route(fresh->plan, fresh->dispatch);
  }
  if (leases.ok() && !fresh->dispatch.transport.ok()) leases = fresh->dispatch.transport.status();
  if (!leases.ok()) {
    // Retried once the registry changes (a rank or a buffer arrives).
    t.warm.state = v1::WARM_UP_PENDING;
    t.warm.reason = std::string(leases.status().message());
    spdlog::info("[controller] warm-up of transfer '{}' pending: {}", t.name, t.warm.reason);
    return "";
  }
  RenewGenerationLocked(t, *leases);
  if (!reroute && workers_->epoch() == epoch) prepared_[t.name] = fresh;
  std::string signature = WarmSignatureLocked(t, *fresh);
  if (t.warm.state == v1::WARM_UP_WARM && t.warm.signature == signature) return "";
  return LaunchWarmUpLocked(t, *fresh, std::move(signature));
}

std::string SyncCoordinator::WarmUpLaunchedFor(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(name);
  if (it == transfers_.end()) return "";
  const WarmUpRecord& w = it->second.warm;
  return !w.id.empty() && w.launched_for == it->second.definition ? w.id : "";
}

std::string SyncCoordinator::WarmSignatureLocked(const Transfer& t, const Prepared& prepared) {
  std::string sig = absl::StrCat("g", t.generation);
  for (size_t w = 0; w < prepared.resolved.workers.size(); ++w) {
    const WorkerSnapshot& ws = prepared.resolved.workers[w];
    absl::StrAppend(&sig, "|", ws.lease_id, ":", ws.registration, ":", prepared.parts[w].key);
  }
  return sig;
}

std::string SyncCoordinator::LaunchWarmUpLocked(Transfer& t, const Prepared& prepared,
                                                std::string signature) {
  const absl::Time now = absl::Now();
  WarmUpRecord& w = t.warm;
  if (!w.id.empty()) {
    // Its late reports are still answered OK (see WarmUpReportLocked).
    if (earlier_warm_ups_.size() >= 256) earlier_warm_ups_.pop_front();
    earlier_warm_ups_.push_back(w.id);
  }
  w.state = v1::WARM_UP_RUNNING;
  w.id = absl::StrCat(t.name, "@warm#", next_id_++);
  w.launched_for = t.definition;
  w.reason.clear();
  w.generation = t.generation;
  w.signature = std::move(signature);
  w.started = now;
  w.deadline = now + config_.warm_up_deadline;
  w.finished = absl::InfinitePast();
  w.workers.clear();
  // The assignment's fields as a sync's (AssignmentLocked reads these).
  SyncRecord shell;
  shell.status.set_sync_id(w.id);
  shell.status.set_transfer(t.name);
  shell.status.set_plan_key(prepared.plan.plan->key());
  shell.deadline = w.deadline;
  std::string lost;
  for (int32_t i = 0; i < static_cast<int32_t>(prepared.resolved.workers.size()); ++i) {
    const std::string& lease = prepared.resolved.workers[i].lease_id;
    w.workers.push_back({lease, false});
    v1::Assignment a;
    *a.mutable_sync() =
        AssignmentLocked(t, shell, prepared.resolved, prepared.dispatch, prepared.parts[i], i);
    a.mutable_sync()->set_warm_up(true);
    if (!workers_->Push(lease, std::move(a)) && lost.empty()) {
      lost = absl::StrCat(workers_->Describe(lease), " [worker ", i, "] is not alive");
    }
  }
  spdlog::info("[controller] warm-up {} of transfer '{}' started: {} workers, generation {}", w.id,
               t.name, w.workers.size(), w.generation);
  const std::string id = w.id;
  if (!lost.empty()) EndWarmUpLocked(t, false, lost);
  cv_.SignalAll();
  return id;
}

std::optional<absl::Status> SyncCoordinator::WarmUpReportLocked(
    const v1::ReportResultRequest& req) {
  for (auto& [name, t] : transfers_) {
    WarmUpRecord& w = t.warm;
    if (w.id.empty() || w.id != req.sync_id()) continue;
    size_t i = 0;
    while (i < w.workers.size() && w.workers[i].lease_id != req.lease_id()) ++i;
    if (i == w.workers.size()) {
      return absl::FailedPreconditionError(absl::StrCat("ReportResult: lease '", req.lease_id(),
                                                        "' takes no part in warm-up '", w.id, "'"));
    }
    if (req.direct_writes_unavailable()) workers_->MarkDirectWritesUnavailable(req.lease_id());
    if (req.code() != 0) workers_->ForgetPeerLists(req.lease_id());
    if (!w.running() || w.workers[i].done) return absl::OkStatus();
    w.workers[i].done = true;
    if (req.code() != 0) {
      EndWarmUpLocked(t, false,
                      absl::StrCat(workers_->Describe(req.lease_id()), " [worker ", i,
                                   "] failed: ", req.message()));
      return absl::OkStatus();
    }
    bool all = true;
    for (const WarmUpRecord::Worker& ww : w.workers) all = all && ww.done;
    if (all) EndWarmUpLocked(t, true, "");
    return absl::OkStatus();
  }
  // An earlier warm-up's (aborted, or replaced by a newer one): nothing
  // waits for it.
  for (const std::string& id : earlier_warm_ups_) {
    if (id == req.sync_id()) return absl::OkStatus();
  }
  return std::nullopt;
}

void SyncCoordinator::EndWarmUpLocked(Transfer& t, bool ok, const std::string& reason) {
  WarmUpRecord& w = t.warm;
  if (!w.running()) return;
  w.finished = absl::Now();
  w.state = ok ? v1::WARM_UP_WARM : v1::WARM_UP_FAILED;
  w.reason = reason;
  const double seconds = absl::ToDoubleSeconds(w.finished - w.started);
  if (ok) {
    spdlog::info("[controller] warm-up {} of transfer '{}' done in {:.3f} s", w.id, t.name,
                 seconds);
  } else {
    spdlog::warn("[controller] warm-up {} of transfer '{}' failed in {:.3f} s: {}", w.id, t.name,
                 seconds, reason);
    // Some workers dropped their transport, others may hold it half built:
    // the next sync or warm-up rendezvouses afresh.
    t.generation_broken = true;
    for (const WarmUpRecord::Worker& ww : w.workers) {
      workers_->ForgetPeerLists(ww.lease_id);
      if (ww.done) continue;
      v1::Assignment a;
      a.mutable_abort()->set_sync_id(w.id);
      a.mutable_abort()->set_reason(absl::StrCat("warm-up failed: ", reason));
      workers_->Push(ww.lease_id, std::move(a));
    }
  }
  if (metrics_ != nullptr) metrics_->WarmUpFinished(ok ? "warm" : "failed", seconds);
  for (auto& [name, other] : transfers_) ReleaseHeldLocked(other);
  cv_.SignalAll();
}

std::string SyncCoordinator::WarmingUpLocked(const std::vector<std::string>& leases) {
  for (const auto& [name, t] : transfers_) {
    if (!t.warm.running()) continue;
    for (const WarmUpRecord::Worker& w : t.warm.workers) {
      if (std::find(leases.begin(), leases.end(), w.lease_id) != leases.end()) return t.warm.id;
    }
  }
  return "";
}

void SyncCoordinator::ReleaseHeldLocked(Transfer& t) {
  if (t.in_flight.empty()) return;
  auto it = syncs_.find(t.in_flight);
  if (it == syncs_.end() || it->second->held == nullptr) return;
  SyncRecord& sync = *it->second;
  std::vector<std::string> leases;
  for (const Participant& p : sync.parts) leases.push_back(p.lease_id);
  // Its workers run their queued warm-ups first, each report naming the
  // parts it evicted: dispatched once none is left, the sync's assignments
  // carry every part its workers no longer hold.
  if (!sync.finished() && !WarmingUpLocked(leases).empty()) return;
  const std::shared_ptr<const Prepared> prepared = std::move(sync.held);
  sync.held = nullptr;
  if (sync.finished()) return;
  RenewGenerationLocked(t, leases);  // a failed warm-up broke the generation
  sync.status.set_warm_up(absl::StrCat(
      WarmNoteLocked(t), "; waited ",
      absl::FormatDuration(absl::Trunc(absl::Now() - sync.start, absl::Milliseconds(1))),
      " for it"));
  DispatchLocked(t, sync, *prepared);
  ++sync.changes;
}

void SyncCoordinator::WarmUpLostLocked(const WorkerLoss& loss) {
  for (auto& [name, t] : transfers_) {
    if (!t.warm.running()) continue;
    for (size_t i = 0; i < t.warm.workers.size(); ++i) {
      if (t.warm.workers[i].lease_id != loss.lease_id) continue;
      EndWarmUpLocked(t, false,
                      absl::StrCat(loss.description, " [worker ", i, "] lost: ", loss.reason));
      break;
    }
  }
}

std::optional<absl::StatusOr<v1::SyncStatus>> SyncCoordinator::CancelWarmUpLocked(
    const std::string& id, const std::string& reason, const TrainerCaller& caller) {
  for (auto& [name, t] : transfers_) {
    if (t.warm.id.empty() || t.warm.id != id) continue;
    if (absl::Status owned = CheckOwner("Cancel", name, t.owner, caller, "cancel warm-ups of");
        !owned.ok()) {
      return absl::StatusOr<v1::SyncStatus>(owned);
    }
    EndWarmUpLocked(t, false,
                    absl::StrCat("cancelled by the trainer", reason.empty() ? "" : ": ", reason));
    v1::SyncStatus s;
    s.set_sync_id(id);
    s.set_transfer(name);
    s.set_phase(t.warm.state == v1::WARM_UP_WARM ? v1::SYNC_SUCCEEDED : v1::SYNC_CANCELLED);
    s.set_error(t.warm.reason);
    s.set_workers_total(static_cast<int32_t>(t.warm.workers.size()));
    for (const WarmUpRecord::Worker& w : t.warm.workers)
      s.set_workers_done(s.workers_done() + w.done);
    return absl::StatusOr<v1::SyncStatus>(std::move(s));
  }
  return std::nullopt;
}

void SyncCoordinator::FillWarmUpLocked(const Transfer& t, v1::WarmUpStatus* out) {
  const WarmUpRecord& w = t.warm;
  out->set_state(t.warm_up_enabled ? w.state : v1::WARM_UP_OFF);
  out->set_id(w.id);
  out->set_reason(w.reason);
  out->set_generation(w.generation);
  out->set_workers_total(static_cast<int32_t>(w.workers.size()));
  for (const WarmUpRecord::Worker& ww : w.workers)
    out->set_workers_done(out->workers_done() + ww.done);
  if (w.id.empty()) return;
  out->set_started_unix_us(absl::ToUnixMicros(w.started));
  const absl::Time end = w.running() ? absl::Now() : w.finished;
  out->set_seconds(absl::ToDoubleSeconds(end - w.started));
}

std::string SyncCoordinator::WarmNoteLocked(const Transfer& t) {
  if (!t.warm_up_enabled) return "";
  const WarmUpRecord& w = t.warm;
  switch (w.state) {
    case v1::WARM_UP_WARM:
      if (w.generation == t.generation) return absl::StrCat("warm (warm-up ", w.id, ")");
      return absl::StrCat("cold: transport generation ", t.generation, " is newer than warm-up ",
                          w.id, "'s (", w.generation, ")");
    case v1::WARM_UP_FAILED:
      return absl::StrCat("cold: warm-up ", w.id, " failed: ", w.reason);
    case v1::WARM_UP_PENDING:
      return absl::StrCat("cold: no warm-up could start: ", w.reason);
    case v1::WARM_UP_RUNNING:
      return absl::StrCat("cold: warm-up ", w.id, " still running");
    default:
      return "cold: no warm-up ran yet";
  }
}

}  // namespace wsync::controller
