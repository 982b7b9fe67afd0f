// ControllerState: transfers (definition, binding to registered workers,
// plans, buffer checks).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/plan_names.h"
#include "controller/plan/planner.h"
#include "controller/plan/rank_parts.h"
#include "controller/server/state.h"

namespace wsync::controller {

namespace {

std::string PrefixBuffer(const std::string& group, const std::string& buffer,
                         const std::string& tensor) {
  return absl::StrCat(group, "/", buffer.empty() ? tensor : buffer);
}

// One past the last byte a view touches; 0 if it has no element.
int64_t ViewEnd(const v1::TensorView& v) {
  int64_t last = 0;
  for (int d = 0; d < v.shape_size(); ++d) {
    if (v.shape(d) <= 0) return 0;
    const int64_t stride = d < v.strides_size() ? v.strides(d) : 0;
    last += (v.shape(d) - 1) * stride;
  }
  const int64_t es = DTypeSize(v.dtype());
  return v.byte_offset() + es * (last + 1);
}

}  // namespace

absl::StatusOr<ControllerState::Resolved> ControllerState::ResolveLocked(
    const std::string& name, const std::string& source_group, const std::string& destination_group,
    const v1::TransferSpec& spec) {
  Resolved r;
  r.spec = spec;
  if (r.spec.name().empty()) r.spec.set_name(name);
  absl::flat_hash_map<std::string, int32_t> worker_of_lease;
  auto bind_side = [&](v1::Side* side, const std::string& group,
                       const char* which) -> absl::Status {
    int32_t size = -1;
    for (const auto& [lease, w] : workers_) {
      if (!w->alive) continue;
      for (const auto& m : w->info.memberships()) {
        if (m.group() == group) size = m.group_size();
      }
    }
    if (size < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transfer '", name, "': unknown ", which, " group '", group, "' (no live worker in it)"));
    }
    if (side->ranks_size() != 0 && side->ranks_size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("transfer '", name, "': ", which,
                                                     " side lists ", side->ranks_size(),
                                                     " ranks but group '", group, "' has ", size));
    }
    side->clear_ranks();
    if (side->name().empty()) side->set_name(group);
    for (int32_t rank = 0; rank < size; ++rank) {
      auto it = ranks_.find(absl::StrCat(group, "/", rank));
      if (it == ranks_.end()) {
        return absl::FailedPreconditionError(absl::StrCat("transfer '", name, "': group '", group,
                                                          "' rank ", rank, " of ", size,
                                                          " is not registered"));
      }
      const Worker& w = *workers_.at(it->second);
      auto [wit, inserted] =
          worker_of_lease.emplace(w.lease_id, static_cast<int32_t>(r.leases.size()));
      if (inserted) {
        r.leases.push_back(w.lease_id);
        r.roles.emplace_back();
      }
      v1::Membership role;
      role.set_group(group);
      role.set_rank(rank);
      role.set_group_size(size);
      r.roles[wit->second].push_back(role);
      v1::RankInfo* info = side->add_ranks();
      info->set_worker(wit->second);
      info->set_node(w.info.node());
    }
    for (v1::TensorLayout& t : *side->mutable_tensors()) {
      if (t.has_mesh()) {
        t.mutable_mesh()->set_buffer(PrefixBuffer(group, t.mesh().buffer(), t.name()));
      } else if (t.has_fragments()) {
        for (v1::Fragment& f : *t.mutable_fragments()->mutable_fragments()) {
          f.set_buffer(PrefixBuffer(group, f.buffer(), t.name()));
        }
      }
    }
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
  return r;
}

absl::StatusOr<ControllerState::PlanForSync> ControllerState::GetPlan(
    const v1::TransferSpec& spec) {
  absl::StatusOr<PlanSource::Result> got = plans_->Get(spec);
  if (!got.ok()) {
    return absl::Status(got.status().code(), absl::StrCat("planning transfer '", spec.name(),
                                                          "': ", got.status().message()));
  }
  if (metrics_ != nullptr) {
    if (got->cache_hit) {
      metrics_->PlanCacheHit();
    } else {
      metrics_->PlanCacheMiss();
      metrics_->PlanBuilt(got->seconds);
    }
  }
  return PlanForSync{got->plan, got->cache_hit, got->seconds};
}

absl::StatusOr<std::shared_ptr<const v1::Plan>> ControllerState::WorkerPart(const v1::Plan& plan,
                                                                            int32_t worker) {
  const std::string key = absl::StrCat(plan.key(), "/", worker);
  {
    absl::MutexLock lock(&parts_mu_);
    auto it = parts_.find(key);
    if (it != parts_.end()) return it->second;
  }
  bool has_part = false;
  for (const v1::RankPlan& rp : plan.ranks()) has_part = has_part || rp.worker() == worker;
  std::shared_ptr<const v1::Plan> found;
  std::vector<plan::RankPart> parts;
  if (has_part) {
    // Every worker of the plan asks next: split it for all of them in one
    // pass over its buckets (one scan per worker cost as much as planning).
    parts = plan::SplitRankPlans(plan);
    for (const plan::RankPart& p : parts) {
      if (p.worker == worker) found = p.plan;
    }
  } else {
    // A worker with nothing to do still confirms every sync.
    auto part = std::make_shared<v1::Plan>();
    part->set_key(plan.key());
    part->set_num_rounds(plan.num_rounds());
    part->add_ranks()->set_worker(worker);
    found = std::move(part);
  }
  absl::MutexLock lock(&parts_mu_);
  if (parts_.size() + parts.size() + 1 > 4096) parts_.clear();
  for (plan::RankPart& p : parts) {
    parts_.try_emplace(absl::StrCat(plan.key(), "/", p.worker), std::move(p.plan));
  }
  return parts_.try_emplace(key, found).first->second;
}

absl::Status ControllerState::CheckBuffersLocked(const v1::Plan& part, int32_t worker,
                                                 const Worker& w, bool require_all) {
  absl::flat_hash_map<std::string, int64_t> need;      // buffer -> end byte
  absl::flat_hash_map<std::string, v1::DType> dtypes;  // buffer -> a view dtype
  absl::Status bad_name;
  auto use = [&](const v1::TensorView& v) {
    absl::StatusOr<const std::string*> name =
        PlanName(part, v.buffer_name(), absl::StrCat("plan for worker ", worker));
    if (!name.ok()) {
      bad_name.Update(name.status());
      return;
    }
    int64_t& end = need[**name];
    end = std::max(end, ViewEnd(v));
    dtypes.emplace(**name, v.dtype());
  };
  for (const v1::Bucket& b : part.buckets()) {
    for (const v1::Piece& p : b.pieces()) {
      // A block-fp8 scale piece (scales_of) has no src: its quantized piece's pack writes it.
      if (b.sender() == worker && p.scales_of() == 0) use(p.src());
      if (b.receiver() == worker && p.reduce_id() == 0 && p.quantize_id() == 0) use(p.dst());
    }
  }
  for (const v1::Reduce& red : part.reduces()) {
    if (red.worker() == worker) use(red.dst());
  }
  for (const v1::Quantize& q : part.quantizes()) {
    if (q.worker() != worker) continue;
    use(q.dst());
    use(q.scale_dst());
  }
  if (!bad_name.ok()) return bad_name;
  for (const auto& [buffer, end] : need) {
    std::pair<std::string, std::string> gn = absl::StrSplit(buffer, absl::MaxSplits('/', 1));
    const v1::BufferInfo* found = nullptr;
    bool group_has_buffers = false;
    for (const v1::BufferInfo& info : w.info.buffers()) {
      if (info.group() != gn.first) continue;
      group_has_buffers = true;
      if (info.name() == gn.second) found = &info;
    }
    const std::string who = absl::StrCat(DescribeLocked(w.lease_id), " [worker ", worker, "]");
    if (found == nullptr) {
      if (!require_all && !group_has_buffers) continue;
      return absl::FailedPreconditionError(absl::StrCat(who, " has no buffer '", gn.second,
                                                        "' registered in group '", gn.first,
                                                        "' (the plan uses ", end, " bytes of it)"));
    }
    if (found->bytes() < end) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": buffer '", gn.second, "' of group '", gn.first, "' has ",
                       found->bytes(), " bytes but the plan accesses up to byte ", end));
    }
    const v1::DType want = dtypes.at(buffer);
    if (found->dtype() != v1::DTYPE_UNSPECIFIED && found->dtype() != v1::UINT8 &&
        found->dtype() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": buffer '", gn.second, "' of group '", gn.first, "' is registered as ",
          DTypeName(found->dtype()), " but the layout says ", DTypeName(want)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DefineTransferResponse> ControllerState::DefineTransfer(
    const v1::DefineTransferRequest& req) {
  if (req.name().empty() || req.name().find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("DefineTransfer: bad transfer name '", req.name(), "' (empty or has '/')"));
  }
  Resolved resolved;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(req.name());
    if (it != transfers_.end() && !it->second.in_flight.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("DefineTransfer: transfer '", req.name(),
                                                        "' has sync ", it->second.in_flight,
                                                        " in flight"));
    }
    auto r = ResolveLocked(req.name(), req.source_group(), req.destination_group(), req.spec());
    if (!r.ok()) return r.status();
    resolved = *std::move(r);
  }
  absl::StatusOr<PlanForSync> plan = GetPlan(resolved.spec);
  if (!plan.ok()) return plan.status();
  std::vector<std::shared_ptr<const v1::Plan>> parts;
  for (int32_t w = 0; w < static_cast<int32_t>(resolved.leases.size()); ++w) {
    auto part = WorkerPart(*plan->plan, w);
    if (!part.ok()) return part.status();
    parts.push_back(*part);
  }
  absl::MutexLock lock(&mu_);
  for (int32_t w = 0; w < static_cast<int32_t>(resolved.leases.size()); ++w) {
    Worker* worker = FindAliveLocked(resolved.leases[w]);
    if (worker == nullptr) {
      return absl::AbortedError("DefineTransfer: a worker left while planning; retry");
    }
    absl::Status st = CheckBuffersLocked(*parts[w], w, *worker, /*require_all=*/false);
    if (!st.ok()) return st;
  }
  Transfer& t = transfers_[req.name()];
  if (!t.in_flight.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("DefineTransfer: transfer '", req.name(), "' started a sync meanwhile"));
  }
  t.name = req.name();
  t.source_group = req.source_group();
  t.destination_group = req.destination_group();
  t.spec = req.spec();
  t.plan_key = plan->plan->key();
  t.generation_broken = true;  // layouts may have changed: fresh transport
  v1::DefineTransferResponse resp;
  resp.set_name(t.name);
  resp.set_num_workers(static_cast<int32_t>(resolved.leases.size()));
  resp.set_plan_key(t.plan_key);
  *resp.mutable_summary() = plan->plan->summary();
  return resp;
}

absl::StatusOr<v1::PlanResponse> ControllerState::PlanTransfer(const v1::PlanRequest& req) {
  Resolved resolved;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(req.transfer());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("Plan: unknown transfer '", req.transfer(), "'"));
    }
    const Transfer& t = it->second;
    auto r = ResolveLocked(t.name, t.source_group, t.destination_group, t.spec);
    if (!r.ok()) return r.status();
    resolved = *std::move(r);
  }
  absl::StatusOr<PlanForSync> plan = GetPlan(resolved.spec);
  if (!plan.ok()) return plan.status();
  v1::PlanResponse resp;
  resp.set_plan_key(plan->plan->key());
  resp.set_cache_hit(plan->cache_hit);
  *resp.mutable_summary() = plan->plan->summary();
  if (req.full()) *resp.mutable_plan() = *plan->plan;
  return resp;
}

}  // namespace wsync::controller
