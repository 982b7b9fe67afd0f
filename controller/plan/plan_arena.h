// The arena a whole v1::Plan is built on: blocks from 64 KiB up to 32 MiB,
// from the heap on ordinary pages (why not huge pages: docs/performance-notes.md).
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_

#include <memory>

#include "google/protobuf/arena.h"

namespace wsync::plan {

std::shared_ptr<google::protobuf::Arena> NewPlanArena();

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_ARENA_H_
