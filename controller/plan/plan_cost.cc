#include "controller/plan/plan_cost.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/bucket_steps.h"

namespace wsync::plan {

double LinkSeconds(const v1::LinkModel& lm, LinkClass c, int64_t bytes) {
  const double b = static_cast<double>(bytes);
  switch (c) {
    case LinkClass::kLocal:
      return b / lm.local_copy_bytes_per_second();
    case LinkClass::kNvlink:
      return b / lm.nvlink_bytes_per_second();
    case LinkClass::kNic:
      return b / lm.nic_bytes_per_second();
  }
  return 0;
}

double PipelineRoundCount(int32_t depth, double seconds, double latency) {
  if (depth <= 0 || !(latency > 0) || !(seconds > 0)) return 0;
  return std::min<double>(kMaxPipelineRounds, depth + std::sqrt(depth * seconds / latency));
}

CostModel::CostModel(const v1::LinkModel& lm, int32_t num_workers, int32_t num_rounds)
    : lm_(lm),
      num_workers_(num_workers),
      num_rounds_(num_rounds),
      load_(static_cast<size_t>(num_rounds) * num_workers * kNumLinkDirs, 0.0),
      total_(static_cast<size_t>(num_workers) * kNumLinkDirs, 0.0),
      occupied_(num_rounds, 0) {}

void CostModel::Add(int32_t round, int32_t sender, int32_t receiver, LinkClass c, int64_t bytes) {
  occupied_[round] = 1;
  const double t = LinkSeconds(lm_, c, bytes);
  auto add = [&](int32_t worker, int dir) {
    load_[(static_cast<size_t>(round) * num_workers_ + worker) * kNumLinkDirs + dir] += t;
    total_[static_cast<size_t>(worker) * kNumLinkDirs + dir] += t;
  };
  switch (c) {
    case LinkClass::kLocal:
      add(sender, kLocalCopy);
      break;
    case LinkClass::kNvlink:
      add(sender, kNvlOut);
      add(receiver, kNvlIn);
      break;
    case LinkClass::kNic:
      add(sender, kNicOut);
      add(receiver, kNicIn);
      break;
  }
}

CostReport CostModel::Report(absl::Span<const int32_t> round_first_slot) const {
  CostReport r;
  r.worker_busy_seconds.assign(num_workers_, 0.0);
  for (int32_t w = 0; w < num_workers_; ++w) {
    for (int d = 0; d < kNumLinkDirs; ++d) {
      r.worker_busy_seconds[w] =
          std::max(r.worker_busy_seconds[w], total_[static_cast<size_t>(w) * kNumLinkDirs + d]);
    }
    r.lower_bound_seconds = std::max(r.lower_bound_seconds, r.worker_busy_seconds[w]);
  }
  // A round costs its latency, each step with a bucket its busiest link, and
  // a step latency for each such step after the first (the simulator's
  // rule). Summed per round, then added: a plan without steps adds
  // latency + max per round, as it always did.
  double round_seconds = 0;
  bool stepped = false;  // the round has had a step with a bucket
  for (int32_t slot = 0; slot < num_rounds_; ++slot) {
    if (round_first_slot.empty() ||
        std::binary_search(round_first_slot.begin(), round_first_slot.end(), slot)) {
      if (slot > 0) r.predicted_seconds += round_seconds;
      round_seconds = lm_.round_latency_seconds();
      stepped = false;
    }
    if (!occupied_[slot]) continue;
    const double* base = &load_[static_cast<size_t>(slot) * num_workers_ * kNumLinkDirs];
    if (stepped) round_seconds += lm_.step_latency_seconds();
    round_seconds +=
        *std::max_element(base, base + static_cast<size_t>(num_workers_) * kNumLinkDirs);
    stepped = true;
  }
  if (num_rounds_ > 0) r.predicted_seconds += round_seconds;
  return r;
}

absl::StatusOr<CostReport> EvaluatePlanCost(const v1::Plan& plan, const v1::LinkModel& lm) {
  absl::flat_hash_map<int32_t, int32_t> dense;
  std::vector<std::string> nodes;
  for (const v1::WorkerInfo& wi : plan.workers()) {
    dense.emplace(wi.worker(), static_cast<int32_t>(nodes.size()));
    nodes.push_back(wi.node());
  }
  // Steps: slots [first_slot[r], first_slot[r + 1]) are round r's.
  std::vector<int32_t> steps(std::max(1, plan.num_rounds()), 1);
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.round() < 0 || b.round() >= plan.num_rounds() || b.step() < 0 ||
        b.step() >= kMaxBucketSteps) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", b.id(), ": round ", b.round(),
                                                     " or step ", b.step(), " out of range"));
    }
    steps[b.round()] = std::max(steps[b.round()], b.step() + 1);
  }
  std::vector<int32_t> first_slot(steps.size() + 1, 0);
  for (size_t r = 0; r < steps.size(); ++r) first_slot[r + 1] = first_slot[r] + steps[r];
  CostModel model(lm, static_cast<int32_t>(nodes.size()), first_slot.back());
  for (const v1::Bucket& b : plan.buckets()) {
    auto s = dense.find(b.sender());
    auto r = dense.find(b.receiver());
    if (s == dense.end() || r == dense.end()) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", b.id(), ": worker ", b.sender(),
                                                     " or ", b.receiver(),
                                                     " missing from plan.workers"));
    }
    LinkClass c = LinkClass::kNic;
    if (b.sender() == b.receiver()) {
      c = LinkClass::kLocal;
    } else if (!nodes[s->second].empty() && nodes[s->second] == nodes[r->second]) {
      c = LinkClass::kNvlink;
    }
    model.Add(first_slot[b.round()] + b.step(), s->second, r->second, c, b.bytes());
  }
  return model.Report(first_slot);
}

}  // namespace wsync::plan
