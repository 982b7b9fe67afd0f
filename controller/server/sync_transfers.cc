// SyncCoordinator: transfers (definition, binding to registered workers,
// plans and their worker parts).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

namespace {

std::string PrefixBuffer(const std::string& group, const std::string& buffer,
                         const std::string& tensor) {
  return absl::StrCat(group, "/", buffer.empty() ? tensor : buffer);
}

void PrefixBuffers(const std::string& group, v1::Side* side) {
  for (v1::TensorLayout& t : *side->mutable_tensors()) {
    if (t.has_mesh()) {
      t.mutable_mesh()->set_buffer(PrefixBuffer(group, t.mesh().buffer(), t.name()));
    } else if (t.has_fragments()) {
      for (v1::Fragment& f : *t.mutable_fragments()->mutable_fragments()) {
        f.set_buffer(PrefixBuffer(group, f.buffer(), t.name()));
      }
    }
  }
}

}  // namespace

SyncCoordinator::SyncCoordinator(ControllerConfig config, ControllerMetrics* metrics,
                                 PlanSource* plans, WorkerRegistry* workers, Rendezvous* rendezvous,
                                 StateStore* store)
    : config_(std::move(config)),
      metrics_(metrics),
      plans_(plans),
      workers_(workers),
      rendezvous_(rendezvous),
      store_(store) {}

absl::StatusOr<SyncCoordinator::Resolved> SyncCoordinator::Resolve(
    const std::string& name, const std::string& source_group, const std::string& destination_group,
    const v1::TransferSpec& spec) {
  Resolved r;
  r.spec = spec;
  if (r.spec.name().empty()) r.spec.set_name(name);
  absl::flat_hash_map<std::string, int32_t> worker_of_lease;
  auto bind_side = [&](v1::Side* side, const std::string& group,
                       const char* which) -> absl::Status {
    const WorkerRegistry::Group g = workers_->FindGroup(group);
    if (g.size < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transfer '", name, "': unknown ", which, " group '", group, "' (no live worker in it)"));
    }
    if (side->ranks_size() != 0 && side->ranks_size() != g.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer '", name, "': ", which, " side lists ", side->ranks_size(),
                       " ranks but group '", group, "' has ", g.size));
    }
    side->clear_ranks();
    if (side->name().empty()) side->set_name(group);
    for (int32_t rank = 0; rank < g.size; ++rank) {
      if (!g.ranks[rank].has_value()) {
        return absl::FailedPreconditionError(absl::StrCat("transfer '", name, "': group '", group,
                                                          "' rank ", rank, " of ", g.size,
                                                          " is not registered"));
      }
      const WorkerSnapshot& w = *g.ranks[rank];
      auto [wit, inserted] =
          worker_of_lease.emplace(w.lease_id, static_cast<int32_t>(r.workers.size()));
      if (inserted) {
        r.workers.push_back(w);
        r.roles.emplace_back();
      }
      v1::Membership role;
      role.set_group(group);
      role.set_rank(rank);
      role.set_group_size(g.size);
      r.roles[wit->second].push_back(role);
      v1::RankInfo* info = side->add_ranks();
      info->set_worker(wit->second);
      info->set_node(w.info->node());
    }
    PrefixBuffers(group, side);
    return absl::OkStatus();
  };
  if (source_group.empty() || destination_group.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer '", name, "': source_group and destination_group are required"));
  }
  if (source_group == destination_group) {
    return absl::InvalidArgumentError(absl::StrCat("transfer '", name, "': source and destination ",
                                                   "are the same group '", source_group, "'"));
  }
  absl::Status st = bind_side(r.spec.mutable_source(), source_group, "source");
  if (st.ok()) st = bind_side(r.spec.mutable_destination(), destination_group, "destination");
  if (!st.ok()) return st;
  r.destination_group = destination_group;
  r.staging = TightestStagingLimit(r.workers);
  if (!ApplyStagingLimit(r.staging, &r.spec)) r.staging = StagingLimit();
  r.steps_cleared_by = ClearStepsUnlessEveryWorkerRunsThem(r.workers, &r.spec);
  if (r.steps_cleared_by >= 0) {
    steps_fallback_log_.Note(name, r.workers[r.steps_cleared_by], r.steps_cleared_by);
  }
  return r;
}

absl::StatusOr<SyncCoordinator::PlanForSync> SyncCoordinator::GetPlan(const Resolved& resolved,
                                                                      bool with_parts) {
  const v1::TransferSpec& spec = resolved.spec;
  absl::StatusOr<PlanSource::Result> got = plans_->Get(spec);
  if (!got.ok()) {
    std::string why;
    if (resolved.staging.worker >= 0) {
      why = absl::StrCat(" (staging_cap_bytes lowered to ", spec.options().staging_cap_bytes(),
                         " by the staging limit of ", resolved.staging.description, " [worker ",
                         resolved.staging.worker, "]: --staging_limit_bytes ",
                         resolved.staging.bytes, ")");
    }
    return absl::Status(got.status().code(), absl::StrCat("planning transfer '", spec.name(),
                                                          "': ", got.status().message(), why));
  }
  if (metrics_ != nullptr) {
    if (got->cache_hit) {
      metrics_->PlanCacheHit();
    } else {
      metrics_->PlanCacheMiss();
      metrics_->PlanBuilt(got->seconds);
    }
  }
  PlanForSync out{got->plan, got->cache_hit, got->seconds, {}, {}};
  if (absl::Status st = CheckStagingLimits(*out.plan, resolved.workers); !st.ok()) return st;
  auto shadow = CheckShadowBudgets(*out.plan, spec.staging().mode(), resolved.destination_group,
                                   resolved.workers);
  if (!shadow.ok()) return shadow.status();
  out.shadow = *std::move(shadow);
  if (!with_parts) return out;
  for (int32_t w = 0; w < static_cast<int32_t>(resolved.workers.size()); ++w) {
    auto part = parts_.WorkerPart(*out.plan, w);
    if (!part.ok()) return part.status();
    out.parts.push_back(*std::move(part));
  }
  return out;
}

absl::Status SyncCoordinator::CheckOwner(absl::string_view method, const std::string& name,
                                         const std::string& owner, const TrainerCaller& caller,
                                         absl::string_view action) {
  if (caller.admin || owner.empty() || owner == caller.identity) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      method, ": transfer '", name, "' is owned by '", owner, "'; ", "identity '", caller.identity,
      "' (role trainer) may not ", action, " it: only its owner or role admin may"));
}

void SyncCoordinator::ClaimOwner(Transfer& t, const TrainerCaller& caller) {
  if (!t.owner.empty() || caller.admin || caller.identity.empty()) return;
  spdlog::info("[controller] transfer '{}' had no owner; now owned by '{}'", t.name,
               caller.identity);
  t.owner = caller.identity;
}

absl::StatusOr<v1::DefineTransferResponse> SyncCoordinator::DefineTransfer(
    const v1::DefineTransferRequest& req, const TrainerCaller& caller) {
  if (req.name().empty() || req.name().find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("DefineTransfer: bad transfer name '", req.name(), "' (empty or has '/')"));
  }
  const int64_t bucket = req.spec().options().bucket_bytes();
  if (bucket != 0 && bucket < config_.limits.min_bucket_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("DefineTransfer '", req.name(), "': spec.options.bucket_bytes ", bucket,
                     " is below the controller's minimum of ", config_.limits.min_bucket_bytes,
                     " bytes (--min_bucket_bytes); 0 picks the default"));
  }
  if (absl::Status st =
          CheckRolloutPolicy(req.name(), req.spec().rollout(), req.spec().staging().mode());
      !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("DefineTransfer: ", st.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(req.name());
    if (it != transfers_.end()) {
      absl::Status owned =
          CheckOwner("DefineTransfer", req.name(), it->second.owner, caller, "redefine");
      if (!owned.ok()) return owned;
    }
    if (it != transfers_.end() && !it->second.in_flight.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("DefineTransfer: transfer '", req.name(),
                                                        "' has sync ", it->second.in_flight,
                                                        " in flight"));
    }
  }
  auto resolved = Resolve(req.name(), req.source_group(), req.destination_group(), req.spec());
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<PlanForSync> plan = GetPlan(*resolved, /*with_parts=*/true);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<v1::DefineTransferResponse> resp = RecordDefinition(req, caller, *resolved, *plan);
  // Its workers are prepared now, not at its first sync (docs/warm-up.md).
  if (resp.ok()) {
    std::string warm_up = StartWarmUp(req.name());
    // The warm-up tick may have launched it between the definition and this
    // call: the answer names that one.
    if (warm_up.empty()) warm_up = WarmUpLaunchedFor(req.name());
    resp->set_warm_up_id(warm_up);
  }
  return resp;
}

absl::StatusOr<v1::DefineTransferResponse> SyncCoordinator::RecordDefinition(
    const v1::DefineTransferRequest& req, const TrainerCaller& caller, const Resolved& resolved,
    const PlanForSync& plan) {
  absl::MutexLock lock(&mu_);
  for (int32_t w = 0; w < static_cast<int32_t>(resolved.workers.size()); ++w) {
    std::optional<WorkerSnapshot> worker = workers_->Find(resolved.workers[w].lease_id);
    if (!worker.has_value()) {
      return absl::AbortedError("DefineTransfer: a worker left while planning; retry");
    }
    absl::Status st = CheckBuffers(*plan.parts[w], w, *worker, /*require_all=*/false);
    if (!st.ok()) return st;
  }
  const bool created = transfers_.count(req.name()) == 0;
  Transfer& t = transfers_[req.name()];
  if (created) {
    t.owner = caller.identity;
  } else if (absl::Status owned =
                 CheckOwner("DefineTransfer", req.name(), t.owner, caller, "redefine");
             !owned.ok()) {
    return owned;  // another identity defined it meanwhile
  }
  if (!t.in_flight.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("DefineTransfer: transfer '", req.name(), "' started a sync meanwhile"));
  }
  t.name = req.name();
  ClaimOwner(t, caller);
  t.source_group = req.source_group();
  // What its ranks confirmed (sync_rollout.cc) is of the old group's ranks.
  if (t.destination_group != req.destination_group()) t.served.clear();
  t.destination_group = req.destination_group();
  t.spec = req.spec();
  if (t.warm.running()) EndWarmUpLocked(t, false, "aborted: the transfer was redefined");
  t.warm_up_enabled = config_.warm_up_on_define && !req.no_warm_up();
  if (!t.warm_up_enabled) t.warm = WarmUpRecord();
  ++t.definition;           // a StartSync planning the old spec meanwhile is refused
  prepared_.erase(t.name);  // nor is the old binding kept (it pins the old plan)
  t.plan_key = plan.plan->key();
  t.generation_broken = true;  // layouts may have changed: fresh transport
  // A restarted controller serves it without a new definition (a failed
  // save is logged and counted).
  PersistLocked().IgnoreError();
  v1::DefineTransferResponse resp;
  resp.set_name(t.name);
  resp.set_num_workers(static_cast<int32_t>(resolved.workers.size()));
  resp.set_plan_key(t.plan_key);
  *resp.mutable_summary() = plan.plan->summary();
  for (const v1::WorkerShadow& ws : plan.shadow) *resp.add_shadow() = ws;
  return resp;
}

absl::StatusOr<v1::PlanResponse> SyncCoordinator::PlanTransfer(const v1::PlanRequest& req) {
  Transfer t;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(req.transfer());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("Plan: unknown transfer '", req.transfer(), "'"));
    }
    t = it->second;
  }
  auto resolved = Resolve(t.name, t.source_group, t.destination_group, t.spec);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<PlanForSync> plan = GetPlan(*resolved, /*with_parts=*/false);
  if (!plan.ok()) return plan.status();
  v1::PlanResponse resp;
  resp.set_plan_key(plan->plan->key());
  resp.set_cache_hit(plan->cache_hit);
  *resp.mutable_summary() = plan->plan->summary();
  if (req.full()) *resp.mutable_plan() = *plan->plan;
  resp.set_staging(t.spec.staging().mode());
  for (const v1::WorkerShadow& ws : plan->shadow) *resp.add_shadow() = ws;
  return resp;
}

}  // namespace wsync::controller
