// SyncCoordinator: starting a sync (checks, transport and routes, the
// generation's rendezvous scope, one assignment per worker).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

absl::Status SyncCoordinator::CheckStartLocked(const Transfer& t, const v1::SyncRequest& req,
                                               const TrainerCaller& caller) {
  if (absl::Status owned = CheckOwner("Sync", t.name, t.owner, caller, "sync"); !owned.ok()) {
    return owned;
  }
  if (!t.in_flight.empty()) {
    const auto& running = syncs_.at(t.in_flight)->status;
    return absl::FailedPreconditionError(
        absl::StrCat("Sync: transfer '", t.name, "' has sync ", t.in_flight, " for version ",
                     running.version(), " in flight; version ", req.version(), " refused"));
  }
  const bool resend_ok =
      req.resend() && t.last_success_version > 0 && req.version() == t.last_success_version;
  if (req.version() <= t.last_success_version && !resend_ok) {
    return absl::FailedPreconditionError(
        absl::StrCat("Sync: version ", req.version(), " of transfer '", t.name,
                     "' is not newer than the last delivered version ", t.last_success_version,
                     req.version() == t.last_success_version ? " (set resend to send it again)"
                                                             : " (versions never go backwards)"));
  }
  // A version far ahead would leave no newer one to sync (INT64_MAX).
  if (req.version() - t.last_success_version > config_.limits.max_version_jump) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sync: version ", req.version(), " of transfer '", t.name, "' is more than ",
                     config_.limits.max_version_jump, " ahead of the last successful version ",
                     t.last_success_version, " (--max_version_jump)"));
  }
  // Rolling waves (docs/staging.md): a new version may not leave a replica
  // more than max_staleness versions behind; a resend only brings them up.
  if (!req.resend()) {
    return CheckStaleness(t.name, req.version(), t.last_success_version,
                          t.spec.rollout().max_staleness(), ServedReplicasLocked(t));
  }
  return absl::OkStatus();
}

SyncCoordinator::Dispatch SyncCoordinator::Decide(const std::string& transfer,
                                                  const Resolved& resolved,
                                                  const PlanForSync& plan) {
  Dispatch d;
  if (plan.plan->summary().network_bytes() == 0) return d;
  d.transport = CommonTransport(transfer, resolved.workers);
  // Staged syncs write shadows: a peer writing the live tensors would break
  // them (docs/staging.md), so everything goes through the transport.
  // Verify mode compares the live destinations with their sources through
  // the plan's buckets: direct writes (no bucket on the receiver) are off.
  if (!d.transport.ok() || !config_.direct_writes ||
      resolved.spec.staging().mode() != v1::STAGING_IN_PLACE || resolved.spec.staging().verify()) {
    return d;
  }
  // Which pairs the plan allows to write directly: scanned once per plan key.
  std::shared_ptr<const std::vector<plan::WorkerPair>> eligible =
      plans_->PeerWritePairs(*plan.plan);
  // Which of them can connect: decided per sync, as domains, peer GPUs and
  // buffer locations may change with every registration.
  std::vector<plan::RouteEndpoint> endpoints;
  for (const WorkerSnapshot& w : resolved.workers) {
    plan::RouteEndpoint e;
    e.domain = w.info->direct_write_domain();
    e.node = w.info->node();
    e.device_uuid = w.info->device_uuid();
    e.peer_gpus.assign(w.info->peer_gpu_uuids().begin(), w.info->peer_gpu_uuids().end());
    e.unavailable = w.direct_writes_unavailable;
    e.unmappable_buffers = w.unmappable_buffers;
    endpoints.push_back(std::move(e));
  }
  d.peer_writes = plan::ChoosePeerWrites(*eligible, endpoints, *d.transport);
  return d;
}

std::vector<SyncCoordinator::RoutedPartRef> SyncCoordinator::Route(const PlanForSync& plan,
                                                                   const Dispatch& dispatch) {
  // Put phases (controller/plan/put_phases.h) depend on every pair of the
  // sync, planned once per plan and pair set (PartCache::PutPhases); each
  // part's key names its own buckets' phases, so a part whose phases stay is
  // not sent again.
  std::shared_ptr<const PartCache::Phases> phases;
  if (config_.put_phases && !dispatch.peer_writes.empty()) {
    phases = parts_.PutPhases(*plan.plan, plan.parts, dispatch.peer_writes);
  }
  const std::string no_key;
  std::vector<RoutedPartRef> out;
  for (int32_t w = 0; w < static_cast<int32_t>(plan.parts.size()); ++w) {
    RoutedPartRef ref;
    ref.routes = plan::RoutesOf(dispatch.peer_writes, w);
    const std::string& phases_key =
        phases != nullptr && !ref.routes.empty() ? phases->part_keys[w] : no_key;
    ref.part = parts_.RoutedPart(*plan.plan, w, plan.parts[w], ref.routes, phases_key,
                                 phases != nullptr ? absl::MakeConstSpan(phases->phase_of_bucket)
                                                   : absl::Span<const int32_t>(),
                                 &ref.key);
    out.push_back(std::move(ref));
  }
  return out;
}

int64_t SyncCoordinator::PlannedBytesInto(const v1::Plan& plan, int32_t worker) {
  for (const v1::RankSummary& r : plan.summary().ranks()) {
    if (r.worker() == worker) return r.bytes_in() + r.bytes_local();
  }
  return plan.summary().destination_bytes();
}

std::unique_ptr<SyncCoordinator::SyncRecord> SyncCoordinator::NewRecordLocked(
    const Transfer& t, const v1::SyncRequest& req, const PlanForSync& plan, absl::Time trigger,
    int32_t num_workers) {
  const absl::Duration deadline =
      req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms()) : config_.sync_deadline;
  auto sync = std::make_unique<SyncRecord>();
  sync->start = trigger;
  sync->status.set_started_unix_us(absl::ToUnixMicros(trigger));
  sync->deadline = trigger + deadline;
  v1::SyncStatus& s = sync->status;
  s.set_sync_id(absl::StrCat(t.name, "@", req.version(), "#", next_id_++));
  s.set_transfer(t.name);
  s.set_version(req.version());
  s.set_phase(v1::SYNC_RUNNING);
  s.set_bytes_total(plan.plan->summary().destination_bytes());
  s.set_workers_total(num_workers);
  s.set_failed_rank(-1);
  s.set_failed_worker(-1);
  s.set_failed_round(-1);
  s.set_failed_op(-1);
  s.set_failed_peer(-1);
  s.set_plan_key(plan.plan->key());
  return sync;
}

v1::SyncAssignment SyncCoordinator::AssignmentLocked(const Transfer& t, const SyncRecord& sync,
                                                     const Resolved& resolved,
                                                     const Dispatch& dispatch,
                                                     const RoutedPartRef& part, int32_t w) {
  const int32_t num_workers = static_cast<int32_t>(resolved.workers.size());
  const std::string& lease = resolved.workers[w].lease_id;
  v1::SyncAssignment sa;
  sa.set_sync_id(sync.status.sync_id());
  sa.set_transfer(t.name);
  sa.set_version(sync.status.version());
  sa.set_plan_key(sync.status.plan_key());
  sa.set_worker(w);
  sa.set_part_key(part.key);
  if (workers_->MarkPartSent(lease, part.key)) *sa.mutable_plan() = *part.part;
  if (dispatch.transport.ok() && *dispatch.transport != v1::TRANSPORT_KIND_UNSPECIFIED) {
    v1::TransportSetup* ts = sa.mutable_transport();
    ts->set_kind(*dispatch.transport);
    ts->set_rank(w);
    ts->set_size(num_workers);
    ts->set_kv_prefix(Rendezvous::ScopePrefix(t.name, t.generation));
    ts->set_generation(t.generation);
  }
  for (int32_t peer : part.routes.write_to) sa.add_direct_write_to(peer);
  for (int32_t peer : part.routes.written_by) sa.add_direct_written_by(peer);
  // Also with no peers: the record of the lists sent to this worker follows
  // what it keeps (the peers of its latest assignment).
  std::vector<std::pair<int32_t, std::string>> write_to;
  for (int32_t peer : part.routes.write_to) {
    write_to.emplace_back(peer, resolved.workers[peer].lease_id);
  }
  workers_->FillPeerBuffers(lease, t.name, write_to, &sa);
  sa.set_deadline_unix_ms(absl::ToUnixMillis(sync.deadline));
  for (const auto& role : resolved.roles[w]) *sa.add_roles() = role;
  if (resolved.spec.staging().mode() != v1::STAGING_IN_PLACE || resolved.spec.staging().verify()) {
    *sa.mutable_staging() = resolved.spec.staging();
  }
  return sa;
}

void SyncCoordinator::DispatchLocked(const Transfer& t, SyncRecord& sync,
                                     const Prepared& prepared) {
  for (Participant& p : sync.parts) {
    v1::Assignment a;
    *a.mutable_sync() = AssignmentLocked(t, sync, prepared.resolved, prepared.dispatch,
                                         prepared.parts[p.worker], p.worker);
    p.pushed = absl::Now();
    workers_->Push(p.lease_id, std::move(a));  // a lost worker fails the sync (WorkerLost)
  }
}

absl::StatusOr<std::vector<std::string>> SyncCoordinator::CheckWorkersLocked(
    Resolved& resolved, const PlanForSync& plan, bool* reroute) {
  std::vector<std::string> leases;
  *reroute = false;
  for (int32_t w = 0; w < static_cast<int32_t>(resolved.workers.size()); ++w) {
    const std::string lease = resolved.workers[w].lease_id;
    std::optional<WorkerSnapshot> worker = workers_->Find(lease);
    if (!worker.has_value()) {
      return absl::UnavailableError(
          absl::StrCat("Sync: ", workers_->Describe(lease), " left while planning"));
    }
    absl::Status st = CheckBuffers(*plan.parts[w], w, *worker, /*require_all=*/true);
    if (!st.ok()) return st;
    WorkerSnapshot& used = resolved.workers[w];
    if (worker->direct_writes_unavailable != used.direct_writes_unavailable ||
        worker->unmappable_buffers != used.unmappable_buffers ||
        worker->info->direct_write_domain() != used.info->direct_write_domain()) {
      // E.g. a report of direct_writes_unavailable that arrived while planning.
      used = *std::move(worker);
      *reroute = true;
    }
    leases.push_back(lease);
  }
  return leases;
}

void SyncCoordinator::RenewGenerationLocked(Transfer& t, const std::vector<std::string>& leases) {
  if (t.generation != 0 && !t.generation_broken && t.generation_leases == leases) return;
  rendezvous_->OpenScope(t.name, t.generation, t.generation + 1, leases);
  ++t.generation;
  t.generation_leases = leases;
  t.generation_broken = false;
}

absl::StatusOr<std::shared_ptr<SyncCoordinator::Prepared>> SyncCoordinator::Prepare(
    const Transfer& t, uint64_t registry_epoch) {
  auto p = std::make_shared<Prepared>();
  p->definition = t.definition;
  p->registry_epoch = registry_epoch;
  auto resolved = Resolve(t.name, t.source_group, t.destination_group, t.spec);
  if (!resolved.ok()) return resolved.status();
  p->resolved = *std::move(resolved);
  absl::StatusOr<PlanForSync> plan = GetPlan(p->resolved, /*with_parts=*/true);
  if (!plan.ok()) return plan.status();
  p->plan = *std::move(plan);
  p->dispatch = Decide(t.name, p->resolved, p->plan);
  p->parts = Route(p->plan, p->dispatch);
  return p;
}

std::shared_ptr<const SyncCoordinator::Prepared> SyncCoordinator::ReusableLocked(
    const std::string& name, uint64_t definition, uint64_t registry_epoch) {
  auto it = prepared_.find(name);
  if (it == prepared_.end() || it->second->definition != definition ||
      it->second->registry_epoch != registry_epoch) {
    return nullptr;
  }
  return it->second;
}

absl::StatusOr<v1::SyncResponse> SyncCoordinator::StartSync(const v1::SyncRequest& req,
                                                            const TrainerCaller& caller) {
  const absl::Time trigger = absl::Now();
  if (req.deadline_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sync: negative deadline_ms ", req.deadline_ms()));
  }
  const absl::Duration max_deadline = config_.limits.max_sync_deadline;
  if (absl::Milliseconds(req.deadline_ms()) > max_deadline) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sync of transfer '", req.transfer(), "': deadline_ms ", req.deadline_ms(),
                     " exceeds the controller's maximum of ",
                     absl::ToInt64Milliseconds(max_deadline), " ms (--max_sync_deadline)"));
  }
  // Read before anything is bound: a registry change after this makes the
  // result stale, and it is then not reused.
  const uint64_t epoch = workers_->epoch();
  std::shared_ptr<const Prepared> prepared;
  std::optional<Transfer> defined;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(req.transfer());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("Sync: unknown transfer '", req.transfer(), "'"));
    }
    if (absl::Status st = CheckStartLocked(it->second, req, caller); !st.ok()) return st;
    prepared = ReusableLocked(it->first, it->second.definition, epoch);
    if (prepared == nullptr) defined = it->second;
  }
  // Binding, planning (a cache hit after the first sync), extraction and
  // routing run unlocked, and only when the last sync's cannot be reused.
  std::shared_ptr<Prepared> fresh;
  if (prepared == nullptr) {
    auto p = Prepare(*defined, epoch);
    if (!p.ok()) return p.status();
    fresh = *std::move(p);
  } else {
    plans_->CountReuse();
    if (metrics_ != nullptr) metrics_->PlanCacheHit();
  }
  const double plan_seconds = absl::ToDoubleSeconds(absl::Now() - trigger);

  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(req.transfer());
  if (it == transfers_.end()) return absl::NotFoundError("Sync: transfer removed meanwhile");
  Transfer& t = it->second;
  if (absl::Status st = CheckStartLocked(t, req, caller); !st.ok()) return st;
  const uint64_t definition = fresh != nullptr ? fresh->definition : prepared->definition;
  if (t.definition != definition) {
    return absl::AbortedError(
        absl::StrCat("Sync: transfer '", t.name, "' redefined while planning; retry"));
  }
  std::vector<std::string> leases;
  if (fresh != nullptr || workers_->epoch() != epoch) {
    if (fresh == nullptr) fresh = std::make_shared<Prepared>(*prepared);
    bool reroute = false;
    absl::StatusOr<std::vector<std::string>> checked =
        CheckWorkersLocked(fresh->resolved, fresh->plan, &reroute);
    if (!checked.ok()) return checked.status();
    leases = *std::move(checked);
    if (reroute) {
      // Rare (a worker's direct-write state changed while planning): decided
      // again under the lock, from the fresh snapshots.
      fresh->dispatch = Decide(t.name, fresh->resolved, fresh->plan);
      fresh->parts = Route(fresh->plan, fresh->dispatch);
    }
    // Reused only if nothing changed since it was bound.
    if (!reroute && workers_->epoch() == epoch) prepared_[t.name] = fresh;
    prepared = fresh;
  } else {
    // Nothing changed since these workers were checked for the last sync.
    for (const WorkerSnapshot& w : prepared->resolved.workers) leases.push_back(w.lease_id);
  }
  const Resolved& resolved = prepared->resolved;
  const PlanForSync& plan = prepared->plan;
  const Dispatch& dispatch = prepared->dispatch;
  // Before the generation changes: a refused sync leaves the transfer as it was.
  if (!dispatch.transport.ok()) return dispatch.transport.status();
  RenewGenerationLocked(t, leases);
  const int32_t num_workers = static_cast<int32_t>(leases.size());
  std::unique_ptr<SyncRecord> sync = NewRecordLocked(t, req, plan, trigger, num_workers);
  sync->started_by = caller.identity;
  ClaimOwner(t, caller);
  v1::SyncStatus& s = sync->status;
  s.set_plan_seconds(plan_seconds);
  s.set_direct_pairs(static_cast<int32_t>(dispatch.peer_writes.size()));
  sync->staging = resolved.spec.staging();
  sync->rollout = t.spec.rollout();
  s.set_staging(sync->staging.mode());
  if (sync->staging.mode() != v1::STAGING_IN_PLACE || sync->staging.verify()) {
    sync->plan = plan.plan;
  }
  for (int32_t w = 0; w < num_workers; ++w) {
    Participant p;
    // plan.shadow lists exactly the workers that stage (StagesShadow in
    // common/shadow_extents.h, the worker's own test).
    for (const v1::WorkerShadow& ws : plan.shadow) {
      if (ws.worker() == w) p.stages = true;
    }
    p.worker = w;
    p.lease_id = leases[w];
    // Absent (a worker older than session 16): the 5 s default; 0 means 0.
    if (resolved.workers[w].info->has_decision_slack_ms()) {
      p.decision_slack = absl::Milliseconds(resolved.workers[w].info->decision_slack_ms());
    }
    p.roles = resolved.roles[w];
    p.part_key = prepared->parts[w].key;
    p.bytes_planned = PlannedBytesInto(*plan.plan, w);
    sync->parts.push_back(std::move(p));
  }
  if (const std::string warming = WarmingUpLocked(leases); !warming.empty()) {
    // Its workers are busy preparing (this transfer or another): the
    // assignments go out once their warm-ups ended (ReleaseHeldLocked), or
    // the sync's deadline ends it (WarmUpTick).
    sync->held = prepared;
    s.set_warm_up(absl::StrCat("waiting for warm-up ", warming));
  } else {
    s.set_warm_up(WarmNoteLocked(t));
    DispatchLocked(t, *sync, *prepared);
  }
  s.set_dispatch_seconds(absl::ToDoubleSeconds(absl::Now() - trigger));
  const std::string id = s.sync_id();
  t.in_flight = id;
  t.plan_key = plan.plan->key();
  if (metrics_ != nullptr) metrics_->SyncStarted(id, t.name, sync->deadline);
  syncs_[id] = std::move(sync);
  sync_order_.push_back(id);
  v1::SyncResponse resp;
  resp.set_sync_id(id);
  resp.set_plan_key(plan.plan->key());
  resp.set_plan_cache_hit(fresh == nullptr || plan.cache_hit);
  return resp;
}

}  // namespace wsync::controller
