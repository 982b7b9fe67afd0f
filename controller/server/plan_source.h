// Plans for the controller: the planner's PlanCache (one BuildPlan per
// distinct bound spec, concurrent misses build once), plus whether each
// lookup hit, for metrics and SyncResponse.plan_cache_hit.
#ifndef WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_
#define WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "controller/plan/plan_cache.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::controller {

class PlanSource {
 public:
  struct Result {
    std::shared_ptr<const v1::Plan> plan;
    bool cache_hit = false;
    double seconds = 0;  // planning wall time (0 on a hit)
  };

  explicit PlanSource(size_t capacity = 64) : cache_(capacity) {}

  absl::StatusOr<Result> Get(const v1::TransferSpec& spec);

  int64_t hits() const { return cache_.hits(); }
  int64_t misses() const { return cache_.misses(); }

 private:
  plan::PlanCache cache_;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_
