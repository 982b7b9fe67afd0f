#include "controller/server/plan_source.h"

namespace wsync::controller {

absl::StatusOr<PlanSource::Result> PlanSource::Get(const v1::TransferSpec& spec) {
  // A miss counted during our call is ours unless another caller missed at
  // the same moment; the flag only feeds metrics and status, never logic.
  const int64_t misses_before = cache_.misses();
  absl::StatusOr<std::shared_ptr<const v1::Plan>> plan = cache_.GetOrBuild(spec);
  if (!plan.ok()) return plan.status();
  Result r;
  r.plan = *std::move(plan);
  r.cache_hit = cache_.misses() == misses_before;
  r.seconds = r.cache_hit ? 0.0 : r.plan->summary().plan_seconds();
  return r;
}

}  // namespace wsync::controller
