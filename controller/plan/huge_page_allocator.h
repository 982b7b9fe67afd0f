// An allocator for the planner's large working arrays (transfers, cells,
// buckets, boxes; read in random order). Arrays of 2 MiB or more are mmap'd
// 2 MiB-aligned and advised for transparent huge pages; smaller ones use
// malloc. Why: docs/performance-notes.md.
#ifndef WSYNC_CONTROLLER_PLAN_HUGE_PAGE_ALLOCATOR_H_
#define WSYNC_CONTROLLER_PLAN_HUGE_PAGE_ALLOCATOR_H_

#include <cstddef>
#include <new>
#include <vector>

namespace wsync::plan {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// Raw blocks: at least kHugePageBytes from a huge-page
// mmap, smaller ones from malloc; the size decides both ways, so a block must
// be freed with the size it was allocated with. nullptr when out of memory.
void* AllocateBlock(size_t bytes);
void FreeBlock(void* block, size_t bytes);

// For processes that plan (the controller, wsyncctl, plan_bench), called once
// at start: glibc keeps freed heap memory for the next allocation instead of
// handing it back to the kernel (arrays up to 256 MiB come from the heap, the
// heap is trimmed only past 1 GiB free, and grows 64 MiB at a time), and the
// main heap, given at least 192 MiB free, is advised for transparent huge
// pages (its 2 MiB-aligned interior): its next allocations land on huge pages
// (compiled layouts and the planner's smaller arrays: on the build VM a first
// touch of a 4 KiB page costs ~16-20 us). The price: a process keeps up to its
// peak heap, resident in 2 MiB steps. Threads other than the main one
// allocate from glibc's other arenas, which this leaves alone.
void KeepFreedMemoryForPlanning();

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocator rebind

  T* allocate(size_t n) {
    void* p = AllocateBlock(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();  // what std::allocator does; never caught here
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) { FreeBlock(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

template <typename T>
using BigVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_HUGE_PAGE_ALLOCATOR_H_
