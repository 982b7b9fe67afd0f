// Every worker's part of a plan in one pass (what ExtractRankPlan gives for
// one worker, for all of them), for the controller handing a plan to every
// worker.
#ifndef WSYNC_CONTROLLER_PLAN_RANK_PARTS_H_
#define WSYNC_CONTROLLER_PLAN_RANK_PARTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

struct RankPart {
  int32_t worker = 0;
  std::shared_ptr<const v1::Plan> plan;  // on its own arena
};

// One part per worker that has a RankPlan, in plan.ranks() order; each equal
// to ExtractRankPlan(plan, worker). Within a part, pieces with equal views
// share one TensorView (plan_views.h): parts are read-only (RoutePart copies).
std::vector<RankPart> SplitRankPlans(const v1::Plan& plan);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_RANK_PARTS_H_
