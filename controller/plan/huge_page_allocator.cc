#include "controller/plan/huge_page_allocator.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// Blocks are mapped in power-of-two sizes, so a freed block fits the next
// request of its size class exactly.
size_t SizeClass(size_t size) {
  if (size > (SIZE_MAX >> 1) + 1) return size;  // no power of two holds it: mmap refuses it
  size_t c = kHugePageBytes;
  while (c < size) c <<= 1;
  return c;
}

// Freed blocks are kept (up to kCachedBytes) and handed out again. While a
// plan is built, the planner's growing arrays free their old buffers and ask
// for larger ones, and the next plan's arrays reuse this one's; memory
// touched before costs no page faults, and in a VM the first touch of fresh
// memory (a fault plus zeroing the page) was the largest single cost of
// building a Kimi-K2 plan. The plan arena's blocks (plan_arena.cc) come from
// here too.
class BlockCache {
 public:
  static constexpr size_t kCachedBytes = size_t{512} << 20;

  void* Take(size_t size_class) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*>& blocks = free_[size_class];
    if (blocks.empty()) return nullptr;
    void* block = blocks.back();  // the most recently freed: likeliest in cache
    blocks.pop_back();
    bytes_ -= size_class;
    return block;
  }
  // False when the cache is full (the caller unmaps the block).
  bool Keep(void* block, size_t size_class) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_ + size_class > kCachedBytes) return false;
    free_[size_class].push_back(block);
    bytes_ += size_class;
    return true;
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // by size class
  size_t bytes_ = 0;
};

BlockCache& Cache() {
  // Never destroyed (NOLINT: a leaked singleton on purpose): blocks are still
  // freed by static destructors at exit, after a function-local static would
  // be gone.
  static BlockCache* cache = new BlockCache();  // NOLINT
  return *cache;
}

}  // namespace

void* AllocateBlock(size_t size) {
  if (size < kHugePageBytes) return std::malloc(size);
  const size_t size_class = SizeClass(size);
  if (void* block = Cache().Take(size_class)) return block;
  return AllocateHugePageBlock(size_class);
}

namespace {

// The main (brk) heap's range: the lowest start and the highest end of the
// "[heap]" lines of /proc/self/maps (madvise splits the heap into several
// mappings); {0, 0} when there is none or the file cannot be read.
std::pair<uintptr_t, uintptr_t> MainHeapRange() {
  std::ifstream maps("/proc/self/maps");
  uintptr_t first = UINTPTR_MAX, last = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.size() < 6 || line.compare(line.size() - 6, 6, "[heap]") != 0) continue;
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && hi > lo) {
      first = std::min(first, lo);
      last = std::max(last, hi);
    }
  }
  if (last == 0) return {0, 0};
  return {first, last};
}

// Where the probe's address goes, so that the compiler keeps the probe's
// malloc and free (a pair whose pointer does not escape may be removed).
void* volatile probe_sink = nullptr;

// Allocates a 192 MiB probe and frees it again, so that the main heap has
// that much free (grown at its top when no hole was large enough; it stays:
// the heap is trimmed only past 1 GiB free), then advises the heap's
// 2 MiB-aligned interior (/proc/self/maps' [heap] mappings) for huge pages:
// what the main thread allocates next, from the top or from a hole an
// earlier phase freed, lands on huge pages when first touched -- what
// glibc's glibc.malloc.hugetlb=1 tunable does, which must be set before the
// process starts. Nothing is advised when /proc cannot be read or the probe
// lay outside the heap. Only virtual memory until touched; pages touched
// before the call may be collapsed by khugepaged (resident in 2 MiB steps).
void AdviseMainHeapForHugePages() {
  constexpr size_t kProbeBytes = size_t{192} << 20;  // below M_MMAP_THRESHOLD: from brk
  void* probe = std::malloc(kProbeBytes);
  if (probe == nullptr) return;
  probe_sink = probe;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(probe);
  auto [lo, hi] = MainHeapRange();
  std::free(probe);
  // When brk cannot grow, glibc serves the block from an mmap'd region
  // outside [heap]: then there is nothing to advise.
  if (hi == 0 || begin < lo || begin + kProbeBytes > hi) return;
  lo = (lo + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  hi = hi & ~(kHugePageBytes - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // advice only
}

}  // namespace

void KeepFreedMemoryForPlanning() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  AdviseMainHeapForHugePages();
}

void FreeBlock(void* block, size_t size) {
  if (size < kHugePageBytes) {
    std::free(block);
    return;
  }
  const size_t size_class = SizeClass(size);
  if (!Cache().Keep(block, size_class)) munmap(block, size_class);
}

}  // namespace wsync::plan
