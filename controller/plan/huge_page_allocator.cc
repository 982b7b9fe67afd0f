#include "controller/plan/huge_page_allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

namespace wsync::plan {

namespace {

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

}  // namespace

void* AllocateBlock(size_t size) {
  return size < kHugePageBytes ? std::malloc(size) : AllocateHugePageBlock(size);
}

void FreeBlock(void* block, size_t size) {
  if (size < kHugePageBytes) {
    std::free(block);
  } else {
    munmap(block, size);
  }
}

}  // namespace wsync::plan
