// The arena a whole v1::Plan is built on: blocks from 64 KiB up to 32 MiB;
// those of 2 MiB and more on transparent huge pages, from and back to the
// planner's block cache (huge_page_allocator.h; why: docs/performance-notes.md).
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_

#include <memory>

#include "google/protobuf/arena.h"

namespace wsync::plan {

std::shared_ptr<google::protobuf::Arena> NewPlanArena();

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_
