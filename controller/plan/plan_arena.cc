#include "controller/plan/plan_arena.h"

#include "controller/plan/huge_page_allocator.h"

namespace wsync::plan {

std::shared_ptr<google::protobuf::Arena> NewPlanArena() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 32 << 20;
  options.block_alloc = &AllocateBlock;
  options.block_dealloc = &FreeBlock;
  return std::make_shared<google::protobuf::Arena>(options);
}

}  // namespace wsync::plan
