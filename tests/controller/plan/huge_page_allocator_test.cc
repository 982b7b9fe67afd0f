#include "controller/plan/huge_page_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace wsync::plan {
namespace {

TEST(HugePageAllocatorTest, LargeBlocksAreHugePageAlignedAndUsable) {
  const size_t bytes = (size_t{3} << 20) + 5;
  auto* p = static_cast<uint8_t*>(AllocateBlock(bytes));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  std::memset(p, 0xab, bytes);  // every byte of the request is mapped
  EXPECT_EQ(p[bytes - 1], 0xab);
  FreeBlock(p, bytes);
}

// A freed block is handed out again to the next request of its size class
// (power of two), already faulted in; a request of another class gets
// another block.
TEST(HugePageAllocatorTest, FreedBlocksAreReusedWithinTheirSizeClass) {
  void* a = AllocateBlock(size_t{5} << 20);  // class 8 MiB
  ASSERT_NE(a, nullptr);
  FreeBlock(a, size_t{5} << 20);
  void* b = AllocateBlock(size_t{7} << 20);  // class 8 MiB: the same block
  EXPECT_EQ(b, a);
  void* c = AllocateBlock(size_t{3} << 20);  // class 4 MiB: another one
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c, a);
  FreeBlock(c, size_t{3} << 20);
  FreeBlock(b, size_t{7} << 20);
}

TEST(HugePageAllocatorTest, BigVectorGrowsAndKeepsItsElements) {
  BigVector<int64_t> v;
  for (int64_t i = 0; i < (int64_t{1} << 21); ++i) v.push_back(i * 3);
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); i += 4099) ASSERT_EQ(v[i], i * 3);
}

TEST(HugePageAllocatorTest, SmallBlocksComeFromMalloc) {
  void* p = AllocateBlock(100);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 100);
  FreeBlock(p, 100);
}

// The VmFlags of the mapping holding `p` (/proc/self/smaps); "" if none.
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// After KeepFreedMemoryForPlanning the main thread's next heap allocations
// lie in memory advised for huge pages ("hg" in the mapping's VmFlags).
TEST(HugePageAllocatorTest, PlanningProcessesHeapIsAdvisedForHugePages) {
  KeepFreedMemoryForPlanning();
  void* p = std::malloc(size_t{8} << 20);  // from the main heap (brk)
  ASSERT_NE(p, nullptr);
  const std::string flags = VmFlagsOf(static_cast<char*>(p) + (size_t{4} << 20));
  std::free(p);
  ASSERT_FALSE(flags.empty()) << "no mapping found";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

}  // namespace
}  // namespace wsync::plan
