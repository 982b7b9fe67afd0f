#include "worker/agent/sync_runner.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/shadow_extents.h"
#include "common/status_macros.h"
#include "worker/agent/controller_kv_store.h"

namespace wsync::agent {

namespace {
double Since(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

exec::ExecutorOptions ExecutorOptionsOf(const RunnerOptions& o) {
  exec::ExecutorOptions eo;
  eo.round_timeout = o.round_timeout;
  eo.staging_limit_bytes = o.staging_limit_bytes;
  eo.put_gate_timeout = o.put_gate_timeout;
  eo.put_phase_gates = o.put_gate_timeout > absl::ZeroDuration();
  return eo;
}
}  // namespace

std::string PartIdOf(const v1::SyncAssignment& a) {
  return a.part_key().empty() ? absl::StrCat(a.plan_key(), "/", a.worker()) : a.part_key();
}

std::string SyncRunner::PlanId(const v1::SyncAssignment& a) { return PartIdOf(a); }

SyncRunner::SyncRunner(TensorTable* tensors, WorkerMetrics* metrics, RunnerOptions options)
    : tensors_(tensors),
      metrics_(metrics),
      options_(std::move(options)),
      parts_(options_.parts_cache_bytes),
      peers_(options_.backend),
      plane_(options_.backend, ExecutorOptionsOf(options_)),
      shadows_(options_.backend, options_.staging_budget_bytes, options_.arenas) {}

std::string SyncRunner::WhoOf(const v1::SyncAssignment& a) {
  std::string who = absl::StrCat("worker ", a.worker());
  for (const v1::Membership& m : a.roles()) absl::StrAppend(&who, " ", m.group(), "/", m.rank());
  return who;
}

absl::Status SyncRunner::CheckArenasUsable(const v1::Plan& part, const std::string& who) const {
  if (options_.arenas == nullptr || !options_.arenas->AnyUnusable()) return absl::OkStatus();
  for (const std::string& name : part.names()) {
    for (const exec::BufferSide side :
         {exec::BufferSide::kSource, exec::BufferSide::kDestination}) {
      const exec::RegisteredBuffer* b = registry_.Find(side, name);
      if (b == nullptr) continue;  // not this worker's (binding names a missing one)
      // Both sides: a colocated worker may register a name as each.
      RETURN_IF_ERROR(
          options_.arenas->CheckUsable(b->data, who, absl::StrCat("tensor '", name, "'")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const exec::BufferRegistry*> SyncRunner::RegistryFor(const v1::SyncAssignment& a,
                                                                    const v1::Plan& part,
                                                                    bool* staged) {
  *staged = false;
  const v1::StagingMode mode = a.staging().mode();
  const std::string who = WhoOf(a);
  // In place or staged, a part never touches an arena a failed swap left
  // unusable (its range may be unmapped: any access would fault).
  RETURN_IF_ERROR(CheckArenasUsable(part, who));
  // A warm-up beside a pending commit: the shadows belong to that commit.
  if (mode == v1::STAGING_IN_PLACE || commit_pending_) return &registry_;
  if (!a.direct_written_by().empty() || !a.direct_write_to().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": a staged sync with direct writes (peers would write the live tensors)"));
  }
  auto writes = ShadowWrites(part, a.worker());
  if (!writes.ok()) {
    return absl::Status(writes.status().code(), absl::StrCat(who, ": ", writes.status().message()));
  }
  std::map<std::string, int64_t> extents;
  for (const auto& [name, w] : *writes) extents[name] = w.extent;
  // The controller's test too (common/shadow_extents.h): writes nothing, a
  // sender only.
  if (!StagesShadow(extents)) return &registry_;
  RETURN_IF_ERROR(shadows_.Prepare(*writes, mode, registry_, who));
  *staged = true;
  return &shadows_.registry();
}

absl::Status SyncRunner::CommitStaged(const std::string& sync_id) {
  commit_pending_ = false;
  flipped_onto_ = 0;
  RETURN_IF_ERROR(shadows_.Commit());
  const ShadowSet::Flip& flip = shadows_.flipped();
  if (flip.to == nullptr) return absl::OkStatus();
  // From here the owner's tensors are the partner's: the next sync's live
  // registry, the verify pass and the owner (told by the COMMITTED event)
  // all see them there. The hold keeps both arenas of the pair.
  const int64_t onto = options_.arenas->HandleOf(flip.to.get());
  if (onto == 0 || !options_.arenas->Flipped(flip.to.get(), sync_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("flip commit onto ", flip.to->Describe(),
                     ": the owner freed it during the commit; nothing moved: the live tensors "
                     "keep the version they held, whole"));
  }
  auto pair = std::make_shared<ShadowSet::Flip>(flip);
  if (tensors_->Rebase(flip.from->base(), flip.from->bytes(), flip.to->base(), pair) == 0) {
    spdlog::warn("flip commit of sync {} onto {}: no registered tensor lay in {}", sync_id,
                 flip.to->Describe(), flip.from->Describe());
  }
  flipped_onto_ = onto;
  return absl::OkStatus();
}

absl::Status SyncRunner::RefreshRegistry() {
  const uint64_t version = tensors_->version();
  if (have_snapshot_ && snapshot_.version == version) return absl::OkStatus();
  TensorSnapshot snap = tensors_->Snapshot();
  exec::BufferRegistry fresh;
  for (const TensorEntry& e : snap.tensors) {
    exec::RegisteredBuffer b;
    b.data = e.data;
    b.bytes = e.bytes;
    b.dtype = e.reg.dtype();
    b.space = options_.backend->memory_space();
    // Plan buffer names carry the group ("<group>/<name>"), so one buffer is
    // found whichever side a view names.
    const std::string name = absl::StrCat(e.group, "/", e.reg.name());
    absl::Status s = fresh.Register(exec::BufferSide::kSource, name, b);
    if (s.ok()) s = fresh.Register(exec::BufferSide::kDestination, name, b);
    if (!s.ok()) return s;
  }
  registry_ = std::move(fresh);
  snapshot_ = std::move(snap);
  have_snapshot_ = true;
  bound_.clear();  // bound against the old memory
  return absl::OkStatus();
}

uint64_t SyncRunner::OwnBuffersFingerprint() {
  if (own_fingerprint_version_ == snapshot_.version) return own_fingerprint_;
  std::vector<v1::BufferInfo> mine;
  std::vector<std::string> objects;
  for (const TensorEntry& e : snapshot_.tensors) {
    mine.push_back(TensorTable::InfoOf(e));
    objects.push_back(e.identity);
  }
  std::vector<const v1::BufferInfo*> refs;
  for (const v1::BufferInfo& b : mine) refs.push_back(&b);
  own_fingerprint_ = BufferListFingerprint(refs, objects);
  own_fingerprint_version_ = snapshot_.version;
  return own_fingerprint_;
}

absl::Status SyncRunner::PrepareDirectWrites(const v1::SyncAssignment& a,
                                             exec::DirectWrites* direct, std::string* key) {
  key->clear();
  // Also with none listed: mappings no sync needs are released (an owner's
  // freed memory stays allocated while anyone maps it).
  RETURN_IF_ERROR(peers_.Update(a.transfer(), a.peer_buffers()));
  if (a.direct_write_to().empty() && a.direct_written_by().empty()) return absl::OkStatus();
  const PeerBufferMaps* peers = peers_.Find(a.transfer());  // null: none listed
  // The peers its part's ROUTE_PEER_WRITE buckets go to (the controller's
  // route stage lists them): their buffers must be mapped.
  for (int32_t w : a.direct_write_to()) {
    const exec::BufferRegistry* r = peers != nullptr ? peers->Find(w) : nullptr;
    if (r == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", a.worker(),
                                                     ": the assignment writes worker ", w,
                                                     " directly but lists none of its buffers"));
    }
    direct->peer_buffers[w] = r;
    direct->expected_ready_tokens[w] = peers->Fingerprint(w);
  }
  direct->ready_token = OwnBuffersFingerprint();
  *key = absl::StrCat("to ", absl::StrJoin(a.direct_write_to(), ","), " by ",
                      absl::StrJoin(a.direct_written_by(), ","), " maps ",
                      peers != nullptr ? peers->Signature() : "");
  return absl::OkStatus();
}

absl::StatusOr<node::Channel*> SyncRunner::EnsureChannel(
    const v1::SyncAssignment& a, std::shared_ptr<v1::WorkerService::Stub> stub,
    const std::string& lease_id) {
  node::ChannelSpec spec;
  spec.network = a.has_transport() && a.transport().size() > 0;
  spec.connect.rank = a.worker();
  if (spec.network) {
    const v1::TransportSetup& ts = a.transport();
    spec.generation = ts.generation();
    spec.kind = ts.kind();
    spec.connect.prefix = ts.kv_prefix();
    spec.connect.rank = ts.rank();
    spec.connect.size = ts.size();
    spec.connect.deadline = absl::FromUnixMillis(a.deadline_unix_ms());
    spec.connect.cancel = &aborted_;
  }
  return plane_.Ensure(a.transfer(), spec, [&]() -> std::unique_ptr<transport::KvStore> {
    return std::make_unique<ControllerKvStore>(std::move(stub), lease_id, &aborted_);
  });
}

void SyncRunner::CachePlan(const v1::SyncAssignment& a) {
  if (!a.has_plan()) return;
  const std::string plan_id = PlanId(a);
  bound_.erase(plan_id);
  for (const std::string& evicted :
       parts_.Put(plan_id, std::make_shared<const v1::Plan>(a.plan()))) {
    bound_.erase(evicted);
  }
}

v1::ReportResultRequest SyncRunner::Begin(const v1::SyncAssignment& a) {
  {
    absl::MutexLock lock(&mu_);
    running_ = a.sync_id();
    running_executor_ = nullptr;
    abort_reason_.clear();
    aborted_.store(false);
    auto it = early_aborts_.find(a.sync_id());
    if (it != early_aborts_.end()) {
      abort_reason_ = it->second;
      aborted_.store(true);
      early_aborts_.erase(it);
    }
  }
  v1::ReportResultRequest r;
  r.set_sync_id(a.sync_id());
  r.set_round(-1);
  r.set_op(-1);
  r.set_peer(-1);
  return r;
}

void SyncRunner::End() {
  absl::MutexLock lock(&mu_);
  running_.clear();
  running_executor_ = nullptr;
}

absl::StatusOr<SyncRunner::BoundPart> SyncRunner::Bind(const v1::SyncAssignment& a,
                                                       const v1::Plan& part,
                                                       v1::ReportResultRequest* r) {
  // Beside a pending commit the snapshot stays: its mappings are the live
  // memory the commit writes (a later sync refreshes it).
  if (!(commit_pending_ && have_snapshot_)) RETURN_IF_ERROR(RefreshRegistry());
  const PeerBufferMaps* held = peers_.Find(a.transfer());
  for (const v1::PeerBuffers& p : a.peer_buffers()) {
    // Not a reason to stop writing directly: the controller, told of the
    // failure, sends every list with the next assignment.
    if (p.unchanged() && (held == nullptr || !held->Holds(p.worker(), p.registration()))) {
      return absl::AbortedError(absl::StrCat(
          "worker ", a.worker(), ": direct writes: the controller sent the buffers of worker ",
          p.worker(), " (registration ", p.registration(),
          ") earlier, but this worker holds no mapping of them; the next sync carries them"));
    }
  }
  exec::DirectWrites direct;
  std::string direct_key;
  absl::Status st = PrepareDirectWrites(a, &direct, &direct_key);
  if (!st.ok()) {
    // The controller then pairs this worker no more; the next sync goes
    // through the transport.
    r->set_direct_writes_unavailable(true);
    peers_.ClearAll();
    return absl::Status(st.code(), absl::StrCat("direct writes: ", st.message()));
  }
  BoundPart out;
  ASSIGN_OR_RETURN(out.registry, RegistryFor(a, part, &out.staged));
  if (out.staged) absl::StrAppend(&direct_key, " shadows ", shadows_.generation());
  const std::string plan_id = PlanId(a);
  auto bit = bound_.find(plan_id);
  if (bit == bound_.end() || bit->second.first != direct_key) {
    bound_.erase(plan_id);  // bound against other peers or mappings
    ASSIGN_OR_RETURN(
        std::shared_ptr<const exec::BoundPlan> b,
        exec::BindPlan(part, a.worker(), *out.registry, options_.backend->memory_space(), &direct));
    bit = bound_.emplace(plan_id, std::make_pair(direct_key, std::move(b))).first;
  }
  out.plan = bit->second.second;
  return out;
}

v1::ReportResultRequest SyncRunner::Run(const v1::SyncAssignment& a,
                                        std::shared_ptr<v1::WorkerService::Stub> stub,
                                        const std::string& lease_id, const ProgressFn& progress) {
  const absl::Time start = absl::Now();
  v1::ReportResultRequest r = Begin(a);
  const std::string plan_id = PlanId(a);
  int32_t rounds_done = 0;
  // Held for the whole run: a failed run clears bound_, and finish() still
  // reads the plan (the sanitizer build caught the use after free).
  std::shared_ptr<const exec::BoundPlan> bound_hold;
  const exec::BoundPlan* bound_plan = nullptr;
  auto finish = [&](const absl::Status& s) {
    if (!s.ok()) {
      r.set_code(static_cast<int32_t>(s.code()));
      r.set_message(std::string(s.message()));
      if (bound_plan != nullptr && rounds_done < static_cast<int32_t>(bound_plan->rounds.size())) {
        r.set_round(bound_plan->rounds[rounds_done].index);
      }
      if (metrics_ != nullptr) metrics_->Error(s.code());
    }
    if (metrics_ != nullptr) metrics_->Sync(Since(start));
    for (std::string& key : parts_.TakeEvicted()) r.add_dropped_part_keys(std::move(key));
    End();
    return r;
  };

  if (commit_pending_) {
    // The agent runs no sync beside a pending commit (agent_exec.cc).
    return finish(absl::FailedPreconditionError(absl::StrCat(
        "worker ", a.worker(), ": sync ", a.sync_id(),
        " refused, nothing written: a staged sync's commit is pending on this worker")));
  }
  // 1. The op list: sent once per plan key, cached afterwards.
  CachePlan(a);
  const std::shared_ptr<const v1::Plan> part = parts_.Get(plan_id);
  if (part == nullptr) {
    // Evicted after the controller sent this assignment: it sends the part
    // again next time.
    r.add_dropped_part_keys(plan_id);
    return finish(absl::FailedPreconditionError(absl::StrCat(
        "worker ", a.worker(), ": no cached op list for plan ", plan_id,
        " (never received, or evicted under --parts_cache_bytes=", parts_.budget_bytes(),
        "; the controller sends it again)")));
  }
  if (aborted_.load()) {
    return finish(absl::AbortedError(absl::StrCat("aborted before it started: ", AbortReason())));
  }
  // 2. Bind to the registered buffers (once per plan and registration).
  absl::Time t = absl::Now();
  auto bound = Bind(a, *part, &r);
  if (!bound.ok()) return finish(bound.status());
  const bool staged = bound->staged;
  const exec::BufferRegistry& registry = *bound->registry;
  bound_hold = bound->plan;
  bound_plan = bound_hold.get();
  r.set_bind_seconds(Since(t));
  // 3. The data plane of this transfer generation.
  t = absl::Now();
  auto ch = EnsureChannel(a, stub, lease_id);
  r.set_setup_seconds(Since(t));
  if (!ch.ok()) {
    plane_.Drop(a.transfer());
    return finish(ch.status());
  }
  node::Channel* channel = *ch;
  bool aborted_before_run;
  {
    absl::MutexLock lock(&mu_);
    aborted_before_run = aborted_.load();
    if (!aborted_before_run) running_executor_ = channel->executor.get();
  }
  if (aborted_before_run) {
    plane_.Drop(a.transfer());
    return finish(
        absl::AbortedError(absl::StrCat("aborted before the first round: ", AbortReason())));
  }
  // 4. Replay.
  t = absl::Now();
  int64_t into_me = 0;
  std::map<int32_t, const exec::BoundRound*> by_index;
  for (const exec::BoundRound& br : bound_plan->rounds) by_index[br.index] = &br;
  auto on_progress = [&](const exec::Progress& p) {
    rounds_done = p.rounds_done;
    if (p.round_index == exec::Progress::kDirectWrites) {
      into_me += bound_plan->bytes_put_into;
      if (metrics_ != nullptr) {
        metrics_->AddBytes(static_cast<double>(bound_plan->bytes_put),
                           static_cast<double>(bound_plan->bytes_put_into));
        metrics_->AddDirectBytes(static_cast<double>(bound_plan->bytes_put),
                                 static_cast<double>(bound_plan->bytes_put_into));
      }
    }
    auto it = by_index.find(p.round_index);
    if (it != by_index.end()) {
      into_me += it->second->bytes_received + it->second->bytes_local;
      if (metrics_ != nullptr) {
        metrics_->AddBytes(static_cast<double>(it->second->bytes_sent),
                           static_cast<double>(it->second->bytes_received));
      }
    }
    if (progress) progress(p.rounds_done, p.rounds_total, into_me);
  };
  const bool checksums = a.staging().mode() != v1::STAGING_IN_PLACE && a.staging().checksums();
  channel->executor->set_checksums(checksums);
  auto stats = channel->executor->Run(*bound_plan, registry.generation(),
                                      absl::FromUnixMillis(a.deadline_unix_ms()), on_progress);
  r.set_execute_seconds(Since(t));
  r.set_bytes_done(into_me);
  if (metrics_ != nullptr) {
    metrics_->Staging(static_cast<double>(channel->executor->allocated_staging_bytes()));
    metrics_->SlowPeerMappings(static_cast<double>(options_.backend->slow_peer_mappings()));
  }
  if (!stats.ok()) {
    if (staged) shadows_.Discard();
    // A failed or aborted run leaves the transport unusable. Abort() from
    // another thread must not reach the executor once it is destroyed.
    {
      absl::MutexLock lock(&mu_);
      running_executor_ = nullptr;
    }
    plane_.Drop(a.transfer());
    // Map the peers afresh next time: one may have recreated its memory
    // under the same names (its ready token then no longer matched).
    if (!a.direct_write_to().empty()) {
      peers_.Clear(a.transfer());
      bound_.clear();
    }
    return finish(stats.status());
  }
  r.set_bytes_sent(stats->bytes_sent);
  if (metrics_ != nullptr && stats->put_gates > 0) {
    metrics_->PutGates(stats->put_gates, static_cast<double>(stats->put_gates_timed_out));
  }
  if (a.staging().verify()) {
    // A staged receiver verifies what it received after the commit
    // (VerifyCommitted); its sources, and everything in place, now.
    absl::Status st = VerifyInto(*bound_plan, exec::VerifySides{true, !staged, !staged}, &r);
    if (!st.ok()) {
      if (staged) shadows_.Discard();
      return finish(st);
    }
  }
  if (staged) {
    r.set_staged(true);
    r.set_shadow_bytes(shadows_.bytes());
    commit_pending_ = true;  // until CommitStaged / DiscardStaged
  }
  for (const exec::BucketChecksum& c : stats->checksums) {
    v1::BucketChecksum* out = r.add_checksums();
    out->set_bucket(c.bucket);
    out->set_hash(c.hash);
    out->set_sent(c.sent);
  }
  if (metrics_ != nullptr) {
    for (const exec::RoundStats& rs : stats->rounds) {
      metrics_->Round(rs.pack_seconds + rs.transfer_seconds + rs.unpack_seconds + rs.copy_seconds +
                      rs.reduce_seconds);
    }
  }
  return finish(absl::OkStatus());
}

void SyncRunner::Abort(const std::string& sync_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!sync_id.empty() && sync_id != running_) {
    if (early_aborts_.size() > 64) early_aborts_.clear();
    early_aborts_[sync_id] = reason;
    return;
  }
  if (running_.empty()) return;
  abort_reason_ = reason;
  aborted_.store(true);
  if (running_executor_ != nullptr) running_executor_->Abort(reason);
}

std::string SyncRunner::AbortReason() {
  absl::MutexLock lock(&mu_);
  return abort_reason_;
}

void SyncRunner::DropTransports() {
  plane_.DropAll();
  peers_.ClearAll();
  bound_.clear();  // some were bound against the peers' mappings
}

}  // namespace wsync::agent
