#include "controller/plan/plan_arena.h"

#include "controller/plan/huge_page_allocator.h"

namespace wsync::plan {
namespace {

// Blocks of 2 MiB and more are huge-page mmaps (AllocateBlock): the plan is
// hundreds of MiB written once, and on the build VM (a paravirtualized
// guest) each first touch of a 4 KiB page is a trap costing ~16-20 us, so
// 4 KiB pages made page faults the largest single cost of emitting a
// Kimi-K2 plan (56 k faults, 0.9-1.2 s for 220 MiB; as huge pages: 110
// faults, 0.02 s when the memory is warm, up to 0.76 s when the host must
// back it first). Freed blocks go back to AllocateBlock's cache, where the
// next plan (or the planner's arrays) takes them warm. Measurements:
// bench/results/plan-emit-2026-11-28.md.
void* PlanBlock(size_t bytes) { return AllocateBlock(bytes); }
void FreePlanBlock(void* block, size_t bytes) { FreeBlock(block, bytes); }

}  // namespace

std::shared_ptr<google::protobuf::Arena> NewPlanArena() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 32 << 20;
  options.block_alloc = &PlanBlock;
  options.block_dealloc = &FreePlanBlock;
  return std::make_shared<google::protobuf::Arena>(options);
}

}  // namespace wsync::plan
