#include "controller/server/part_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/plan/put_phases.h"
#include "controller/plan/rank_parts.h"

namespace wsync::controller {

absl::StatusOr<std::shared_ptr<const v1::Plan>> PartCache::WorkerPart(const v1::Plan& plan,
                                                                      int32_t worker) {
  const std::string key = absl::StrCat(plan.key(), "/", worker);
  {
    absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  if (parts_.size() + parts.size() + 1 > kMaxParts) parts_.clear();
  for (plan::RankPart& p : parts) {
    parts_.try_emplace(absl::StrCat(plan.key(), "/", p.worker), std::move(p.plan));
  }
  return parts_.try_emplace(key, found).first->second;
}

std::shared_ptr<const v1::Plan> PartCache::RoutedPart(const v1::Plan& plan, int32_t worker,
                                                      const std::shared_ptr<const v1::Plan>& part,
                                                      const plan::WorkerRoutes& routes,
                                                      const std::string& phases_key,
                                                      absl::Span<const int32_t> phases,
                                                      std::string* part_key) {
  *part_key = absl::StrCat(plan.key(), "/", worker);
  if (routes.empty()) return part;
  absl::StrAppend(part_key, "/", routes.Signature(), phases_key);
  {
    absl::MutexLock lock(&mu_);
    auto it = parts_.find(*part_key);
    if (it != parts_.end()) return it->second;
  }
  // Marked once per (plan, worker, routes): later syncs find it here.
  std::shared_ptr<const v1::Plan> routed = plan::RoutePart(part, worker, routes, phases);
  absl::MutexLock lock(&mu_);
  if (parts_.size() + 1 > kMaxParts) parts_.clear();
  return parts_.try_emplace(*part_key, std::move(routed)).first->second;
}

std::shared_ptr<const PartCache::Phases> PartCache::PutPhases(
    const v1::Plan& plan, absl::Span<const std::shared_ptr<const v1::Plan>> parts,
    const std::vector<plan::WorkerPair>& pairs) {
  PhasesKey key(plan.key(), pairs);
  {
    absl::MutexLock lock(&mu_);
    auto it = phases_.find(key);
    if (it != phases_.end()) return it->second;
  }
  // Planned unlocked: other plans' syncs do not wait on this one. Two
  // concurrent first syncs of one key may both plan; the first result stays.
  auto phases = std::make_shared<Phases>();
  phases->phase_of_bucket = plan::PlanPutPhases(plan, pairs).phase_of_bucket;
  phases->part_keys.resize(parts.size());
  std::vector<bool> keyed(parts.size(), false);
  for (const plan::WorkerPair& p : pairs) {
    for (const int32_t w : {p.first, p.second}) {
      const size_t at = static_cast<size_t>(w);
      if (w < 0 || at >= parts.size() || parts[at] == nullptr || keyed[at]) continue;
      keyed[at] = true;
      phases->part_keys[at] = plan::PutPhasesKey(*parts[at], phases->phase_of_bucket);
    }
  }
  absl::MutexLock lock(&mu_);
  ++put_phase_plans_;
  if (phases_.size() >= kMaxPhaseSets) phases_.clear();
  return phases_.try_emplace(std::move(key), std::move(phases)).first->second;
}

int64_t PartCache::put_phase_plans() const {
  absl::MutexLock lock(&mu_);
  return put_phase_plans_;
}

}  // namespace wsync::controller
