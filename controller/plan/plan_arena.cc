#include "controller/plan/plan_arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

namespace wsync::plan {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Blocks of at least a huge page come from mmap, aligned to 2 MiB so that the
// kernel can back them with huge pages; smaller ones (the first few blocks of
// a small plan) from malloc. The size decides both ways, so free matches.
void* AllocBlock(size_t size) {
  if (size < kHugePage) return std::malloc(size);
  const size_t span = size + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;  // the arena reports the failed allocation
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + span;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  void* block = reinterpret_cast<void*>(aligned);
  madvise(block, size, MADV_HUGEPAGE);  // advice only: 4 KiB pages still work
  return block;
}

void FreeBlock(void* block, size_t size) {
  if (size < kHugePage) {
    std::free(block);
  } else {
    munmap(block, size);
  }
}

}  // namespace

std::shared_ptr<google::protobuf::Arena> NewPlanArena() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 32 << 20;
  options.block_alloc = &AllocBlock;
  options.block_dealloc = &FreeBlock;
  return std::make_shared<google::protobuf::Arena>(options);
}

}  // namespace wsync::plan
