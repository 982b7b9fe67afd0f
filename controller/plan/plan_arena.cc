#include "controller/plan/plan_arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

#include "controller/plan/huge_page_allocator.h"

namespace wsync::plan {

void* AllocateHugePageBlock(size_t size) {
  const size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Trim to a 2 MiB-aligned start: only aligned 2 MiB ranges can be huge pages.
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + span;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  void* block = reinterpret_cast<void*>(aligned);
  madvise(block, size, MADV_HUGEPAGE);  // advice only: 4 KiB pages still work
  return block;
}

void FreeHugePageBlock(void* block, size_t size) { munmap(block, size); }

namespace {

// Blocks of at least a huge page are huge-page blocks; smaller ones (the first
// blocks of a small plan) come from malloc. The size decides both ways.
void* AllocArenaBlock(size_t size) {
  return size < kHugePageBytes ? std::malloc(size) : AllocateHugePageBlock(size);
}

void FreeArenaBlock(void* block, size_t size) {
  if (size < kHugePageBytes) {
    std::free(block);
  } else {
    FreeHugePageBlock(block, size);
  }
}

}  // namespace

std::shared_ptr<google::protobuf::Arena> NewPlanArena() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 32 << 20;
  options.block_alloc = &AllocArenaBlock;
  options.block_dealloc = &FreeArenaBlock;
  return std::make_shared<google::protobuf::Arena>(options);
}

}  // namespace wsync::plan
