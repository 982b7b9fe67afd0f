// The arena a whole v1::Plan is built on. A Kimi-K2-sized plan is ~0.5 GB of
// small messages; on 4 KiB pages its first touch alone is ~150k page faults,
// a third of the plan time on a VM. Blocks here are large, 2 MiB aligned and
// advised for transparent huge pages, so the same bytes fault in ~250 times.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_

#include <memory>

#include "google/protobuf/arena.h"

namespace wsync::plan {

std::shared_ptr<google::protobuf::Arena> NewPlanArena();

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_
