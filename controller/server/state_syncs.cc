// ControllerState: syncs (trigger, dispatch, reports, completion, aborts).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "controller/server/state.h"

namespace wsync::controller {

absl::StatusOr<v1::SyncResponse> ControllerState::StartSync(const v1::SyncRequest& req) {
  const absl::Time trigger = absl::Now();
  Resolved resolved;
  auto check_transfer = [&](const Transfer& t) -> absl::Status {
    if (!t.in_flight.empty()) {
      const auto& running = syncs_.at(t.in_flight)->status;
      return absl::FailedPreconditionError(
          absl::StrCat("Sync: transfer '", t.name, "' has sync ", t.in_flight, " for version ",
                       running.version(), " in flight; version ", req.version(), " refused"));
    }
    if (req.version() <= t.last_success_version) {
      return absl::FailedPreconditionError(
          absl::StrCat("Sync: version ", req.version(), " of transfer '", t.name,
                       "' is not newer than the last successful version ", t.last_success_version));
    }
    return absl::OkStatus();
  };
  if (req.deadline_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sync: negative deadline_ms ", req.deadline_ms()));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(req.transfer());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("Sync: unknown transfer '", req.transfer(), "'"));
    }
    absl::Status st = check_transfer(it->second);
    if (!st.ok()) return st;
    const Transfer& t = it->second;
    auto r = ResolveLocked(t.name, t.source_group, t.destination_group, t.spec);
    if (!r.ok()) return r.status();
    resolved = *std::move(r);
  }
  // Planning (a cache hit after the first sync) and extraction run unlocked.
  absl::StatusOr<PlanForSync> plan = GetPlan(resolved.spec);
  if (!plan.ok()) return plan.status();
  const int32_t num_workers = static_cast<int32_t>(resolved.leases.size());
  std::vector<std::shared_ptr<const v1::Plan>> parts;
  for (int32_t w = 0; w < num_workers; ++w) {
    auto part = WorkerPart(*plan->plan, w);
    if (!part.ok()) return part.status();
    parts.push_back(*part);
  }
  // Which pairs the plan allows to write directly: scanned once per plan key.
  std::shared_ptr<const std::vector<plan::WorkerPair>> eligible;
  if (config_.direct_writes && plan->plan->summary().network_bytes() > 0) {
    eligible = plans_->DirectWritePairs(*plan->plan);
  }
  const double plan_seconds = absl::ToDoubleSeconds(absl::Now() - trigger);

  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(req.transfer());
  if (it == transfers_.end()) return absl::NotFoundError("Sync: transfer removed meanwhile");
  Transfer& t = it->second;
  absl::Status st = check_transfer(t);
  if (!st.ok()) return st;
  for (int32_t w = 0; w < num_workers; ++w) {
    Worker* worker = FindAliveLocked(resolved.leases[w]);
    if (worker == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("Sync: ", DescribeLocked(resolved.leases[w]), " left while planning"));
    }
    st = CheckBuffersLocked(*parts[w], w, *worker, /*require_all=*/true);
    if (!st.ok()) return st;
  }
  // Before the generation changes: a refused sync leaves the transfer as it was.
  const bool needs_transport = plan->plan->summary().network_bytes() > 0;
  std::string transport_kind;
  if (needs_transport) {
    auto kind = CommonTransportLocked(t.name, resolved.leases);
    if (!kind.ok()) return kind.status();
    transport_kind = *kind;
  }
  // Decided per sync: domains, peer GPUs and buffer locations may change
  // with every registration.
  std::vector<plan::WorkerPair> direct;
  if (needs_transport && eligible != nullptr) {
    direct = DirectPairsLocked(*eligible, resolved.leases, transport_kind);
  }
  if (t.generation == 0 || t.generation_broken || t.generation_leases != resolved.leases) {
    OpenScopeLocked(t);
    t.generation_leases = resolved.leases;
    t.generation_broken = false;
  }
  const absl::Duration deadline =
      req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms()) : config_.sync_deadline;

  auto sync = std::make_unique<SyncRecord>();
  const std::string id = absl::StrCat(t.name, "@", req.version(), "#", next_id_++);
  sync->start = trigger;
  sync->deadline = trigger + deadline;
  v1::SyncStatus& s = sync->status;
  s.set_sync_id(id);
  s.set_transfer(t.name);
  s.set_version(req.version());
  s.set_phase(v1::SYNC_RUNNING);
  s.set_bytes_total(plan->plan->summary().destination_bytes());
  s.set_workers_total(num_workers);
  s.set_failed_rank(-1);
  s.set_failed_worker(-1);
  s.set_failed_round(-1);
  s.set_failed_op(-1);
  s.set_failed_peer(-1);
  s.set_plan_seconds(plan_seconds);
  s.set_plan_key(plan->plan->key());
  s.set_direct_pairs(static_cast<int32_t>(direct.size()));
  const int64_t deadline_unix_ms = absl::ToUnixMillis(sync->deadline);
  for (int32_t w = 0; w < num_workers; ++w) {
    Participant p;
    p.worker = w;
    p.lease_id = resolved.leases[w];
    p.roles = resolved.roles[w];
    Worker& worker = *workers_.at(p.lease_id);
    v1::Assignment a;
    v1::SyncAssignment* sa = a.mutable_sync();
    sa->set_sync_id(id);
    sa->set_transfer(t.name);
    sa->set_version(req.version());
    sa->set_plan_key(plan->plan->key());
    sa->set_worker(w);
    const std::string sent_key = absl::StrCat(plan->plan->key(), "/", w);
    if (worker.plans_sent.insert(sent_key).second) *sa->mutable_plan() = *parts[w];
    if (needs_transport) {
      v1::TransportSetup* ts = sa->mutable_transport();
      ts->set_kind(transport_kind);
      ts->set_rank(w);
      ts->set_size(num_workers);
      ts->set_kv_prefix(absl::StrCat(t.name, "/", t.generation, "/"));
      ts->set_generation(t.generation);
    }
    // Also with no direct writes: the record of the peer lists sent to this
    // worker follows what it keeps (the peers of its latest assignment).
    FillDirectWritesLocked(t.name, direct, w, resolved.leases, sa);
    sa->set_deadline_unix_ms(deadline_unix_ms);
    for (const auto& role : p.roles) *sa->add_roles() = role;
    PushLocked(worker, std::move(a));
    sync->parts.push_back(std::move(p));
  }
  s.set_dispatch_seconds(absl::ToDoubleSeconds(absl::Now() - trigger));
  t.in_flight = id;
  t.plan_key = plan->plan->key();
  syncs_[id] = std::move(sync);
  sync_order_.push_back(id);
  v1::SyncResponse resp;
  resp.set_sync_id(id);
  resp.set_plan_key(plan->plan->key());
  resp.set_plan_cache_hit(plan->cache_hit);
  return resp;
}

absl::Status ControllerState::ReportProgress(const v1::ReportProgressRequest& req) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(req.sync_id());
  if (it == syncs_.end()) {
    return absl::NotFoundError(absl::StrCat("ReportProgress: unknown sync '", req.sync_id(), "'"));
  }
  SyncRecord& sync = *it->second;
  for (Participant& p : sync.parts) {
    if (p.lease_id != req.lease_id()) continue;
    if (!sync.finished() && !p.done) {
      p.bytes_done = req.bytes_done();
      ++sync.changes;
      cv_.SignalAll();
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "ReportProgress: lease '", req.lease_id(), "' takes no part in sync '", req.sync_id(), "'"));
}

absl::Status ControllerState::ReportResult(const v1::ReportResultRequest& req) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(req.sync_id());
  if (it == syncs_.end()) {
    return absl::NotFoundError(absl::StrCat("ReportResult: unknown sync '", req.sync_id(), "'"));
  }
  SyncRecord& sync = *it->second;
  for (Participant& p : sync.parts) {
    if (p.lease_id != req.lease_id()) continue;
    if (auto w = workers_.find(p.lease_id); w != workers_.end()) {
      if (req.direct_writes_unavailable()) w->second->direct_writes_unavailable = true;
      // A worker whose sync failed may have dropped its peer mappings (of
      // this transfer, or all of them): its next assignments carry every
      // list again.
      if (req.code() != 0) w->second->ForgetPeerLists();
    }
    if (p.done) return absl::OkStatus();
    if (sync.finished()) {
      // Late (after an abort or another worker's failure): the outcome
      // stands, but AwaitWriters learns this worker stopped writing.
      p.done = true;
      cv_.SignalAll();
      return absl::OkStatus();
    }
    p.done = true;
    p.bytes_done = req.bytes_done();
    v1::SyncStatus& s = sync.status;
    s.set_workers_done(s.workers_done() + 1);
    s.set_max_setup_seconds(std::max(s.max_setup_seconds(), req.setup_seconds()));
    s.set_max_execute_seconds(std::max(s.max_execute_seconds(), req.execute_seconds()));
    ++sync.changes;
    if (req.code() != 0) {
      FinishLocked(sync, v1::SYNC_FAILED, req.code(),
                   absl::StrCat(DescribeLocked(p.lease_id), " [worker ", p.worker,
                                "] failed: ", req.message()),
                   p.worker, req.round(), req.op(), req.peer());
    } else if (s.workers_done() == s.workers_total()) {
      FinishLocked(sync, v1::SYNC_SUCCEEDED, 0, "", -1, -1, -1, -1);
    }
    cv_.SignalAll();
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "ReportResult: lease '", req.lease_id(), "' takes no part in sync '", req.sync_id(), "'"));
}

void ControllerState::FinishLocked(SyncRecord& sync, v1::SyncPhase phase, int32_t code,
                                   const std::string& error, int32_t cause_worker, int32_t round,
                                   int32_t op, int32_t peer) {
  if (sync.finished()) return;
  v1::SyncStatus& s = sync.status;
  s.set_phase(phase);
  s.set_elapsed_seconds(absl::ToDoubleSeconds(absl::Now() - sync.start));
  int64_t bytes = 0;
  for (const Participant& p : sync.parts) bytes += p.bytes_done;
  s.set_bytes_done(bytes);
  if (phase != v1::SYNC_SUCCEEDED) {
    // Its workers may drop peer mappings while they unwind, or never see
    // their queued assignment: every list goes again, also to a retry
    // started before their reports arrive.
    for (const Participant& p : sync.parts) {
      if (auto w = workers_.find(p.lease_id); w != workers_.end()) w->second->ForgetPeerLists();
    }
    s.set_error_code(code);
    s.set_error(error);
    s.set_failed_worker(cause_worker);
    s.set_failed_round(round);
    s.set_failed_op(op);
    s.set_failed_peer(peer);
    for (const Participant& p : sync.parts) {
      if (p.worker == cause_worker && !p.roles.empty()) {
        s.set_failed_group(p.roles[0].group());
        s.set_failed_rank(p.roles[0].rank());
      }
    }
  }
  auto tit = transfers_.find(s.transfer());
  if (tit != transfers_.end()) {
    Transfer& t = tit->second;
    if (t.in_flight == s.sync_id()) t.in_flight.clear();
    t.last_sync = s.sync_id();
    if (phase == v1::SYNC_SUCCEEDED) {
      t.last_success_version = std::max(t.last_success_version, s.version());
      if (metrics_ != nullptr) metrics_->SetWeightVersion(t.name, t.last_success_version);
    } else {
      t.generation_broken = true;  // aborted transports must be rebuilt
    }
  }
  if (phase != v1::SYNC_SUCCEEDED) {
    for (const Participant& p : sync.parts) {
      if (p.done) continue;
      Worker* w = FindAliveLocked(p.lease_id);
      if (w == nullptr) continue;
      v1::Assignment a;
      a.mutable_abort()->set_sync_id(s.sync_id());
      a.mutable_abort()->set_reason(error);
      PushLocked(*w, std::move(a));
    }
  }
  const char* outcome = phase == v1::SYNC_SUCCEEDED   ? "succeeded"
                        : phase == v1::SYNC_CANCELLED ? "cancelled"
                                                      : "failed";
  if (metrics_ != nullptr) {
    metrics_->SyncFinished(outcome, s.elapsed_seconds(), static_cast<double>(s.bytes_total()));
  }
  std::fprintf(stderr, "[controller] sync %s %s in %.3f s%s%s\n", s.sync_id().c_str(), outcome,
               s.elapsed_seconds(), error.empty() ? "" : ": ", error.c_str());
  ++sync.changes;
  cv_.SignalAll();
}

v1::SyncStatus ControllerState::SnapshotLocked(const SyncRecord& sync) {
  v1::SyncStatus s = sync.status;
  if (!sync.finished()) {
    s.set_elapsed_seconds(absl::ToDoubleSeconds(absl::Now() - sync.start));
    int64_t bytes = 0;
    for (const Participant& p : sync.parts) bytes += p.bytes_done;
    s.set_bytes_done(bytes);
  }
  return s;
}

absl::StatusOr<v1::SyncStatus> ControllerState::WaitSync(const std::string& sync_id,
                                                         absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(sync_id);
  if (it == syncs_.end()) return absl::NotFoundError(absl::StrCat("unknown sync '", sync_id, "'"));
  SyncRecord* sync = it->second.get();
  // Without a timeout the sync's own deadline bounds the wait (Tick ends it).
  const absl::Time until =
      timeout > absl::ZeroDuration() ? absl::Now() + timeout : sync->deadline + absl::Seconds(5);
  while (!sync->finished() && !shutdown_) {
    if (cv_.WaitWithDeadline(&mu_, until)) break;
  }
  return SnapshotLocked(*sync);
}

absl::StatusOr<v1::SyncStatus> ControllerState::NextSyncUpdate(const std::string& sync_id,
                                                               int64_t* seen, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(sync_id);
  if (it == syncs_.end()) return absl::NotFoundError(absl::StrCat("unknown sync '", sync_id, "'"));
  SyncRecord* sync = it->second.get();
  while (sync->changes <= *seen && !sync->finished() && !shutdown_) {
    if (cv_.WaitWithDeadline(&mu_, until)) break;
  }
  *seen = sync->changes;
  return SnapshotLocked(*sync);
}

absl::StatusOr<v1::SyncStatus> ControllerState::Cancel(const std::string& sync_id,
                                                       const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(sync_id);
  if (it == syncs_.end()) return absl::NotFoundError(absl::StrCat("unknown sync '", sync_id, "'"));
  FinishLocked(*it->second, v1::SYNC_CANCELLED, static_cast<int32_t>(absl::StatusCode::kCancelled),
               absl::StrCat("cancelled by the trainer", reason.empty() ? "" : ": ", reason), -1, -1,
               -1, -1);
  return SnapshotLocked(*it->second);
}

v1::GetStatusResponse ControllerState::GetStatus() {
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
    if (!t.in_flight.empty()) ts->set_in_flight_version(syncs_.at(t.in_flight)->status.version());
    auto sit = syncs_.find(t.last_sync);
    if (sit != syncs_.end()) *ts->mutable_last_sync() = SnapshotLocked(*sit->second);
  }
  for (const auto& [lease, w] : workers_) {
    resp.set_workers_registered(resp.workers_registered() + 1);
    if (w->alive) resp.set_workers_alive(resp.workers_alive() + 1);
  }
  resp.set_plan_cache_hits(plans_->hits());
  resp.set_plan_cache_misses(plans_->misses());
  resp.set_controller_instance(config_.instance);
  return resp;
}

absl::StatusOr<v1::AwaitWritersResponse> ControllerState::AwaitWriters(
    const v1::AwaitWritersRequest& req) {
  const absl::Time until = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, req.timeout_ms()));
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("controller is shutting down");
    v1::AwaitWritersResponse resp;
    auto it = syncs_.find(req.sync_id());
    if (it == syncs_.end()) return resp;  // long over: its record was dropped
    for (int32_t w : req.workers()) {
      const Participant* found = nullptr;
      for (const Participant& p : it->second->parts) {
        if (p.worker == w) found = &p;
      }
      if (found == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "AwaitWriters: worker ", w, " takes no part in sync '", req.sync_id(), "'"));
      }
      if (!found->done && FindAliveLocked(found->lease_id) != nullptr) resp.add_pending(w);
    }
    if (resp.pending().empty() || cv_.WaitWithDeadline(&mu_, until)) return resp;
  }
}

}  // namespace wsync::controller
