// Conformance suite every plane::SwapArena implementation must pass (the
// contract in worker/plane/swap_arena.h). A backend's test binary includes
// this header in exactly one .cc, implements SwapArenaTestFactory (the
// backend making arenas; TestMemory's Read/Write reach its memory) and
// instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Host, SwapArenaConformanceTest,
//                            ::testing::Values(std::make_shared<HostArenas>()),
//                            SwapArenaConformanceTest::ParamName);
#ifndef WSYNC_TESTS_WORKER_PLANE_SWAP_ARENA_CONFORMANCE_H_
#define WSYNC_TESTS_WORKER_PLANE_SWAP_ARENA_CONFORMANCE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/plane/plane_test_memory.h"
#include "worker/plane/backend.h"
#include "worker/plane/swap_arena.h"

namespace wsync::plane::conformance {

class SwapArenaTestFactory : public TestMemory {
 public:
  virtual std::string Name() const = 0;
  virtual Backend& backend() = 0;
};

class SwapArenaConformanceTest
    : public ::testing::TestWithParam<std::shared_ptr<SwapArenaTestFactory>> {
 public:
  static std::string ParamName(
      const ::testing::TestParamInfo<std::shared_ptr<SwapArenaTestFactory>>& info) {
    return info.param->Name();
  }

 protected:
  void SetUp() override {
    if (const std::string why = factory().Unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
  SwapArenaTestFactory& factory() { return *GetParam(); }
  std::unique_ptr<SwapArena> Make(int64_t bytes, const std::string& name) {
    auto a = factory().backend().NewSwapArena(bytes, name);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }
  static std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
    return v;
  }
  void Fill(SwapArena& a, uint8_t seed) {
    const auto p = Pattern(static_cast<size_t>(a.bytes()), seed);
    factory().Write(a.base(), p.data(), p.size());
  }
  std::vector<uint8_t> Read(const SwapArena& a) {
    return factory().Download(a.base(), static_cast<size_t>(a.bytes()));
  }
};

TEST_P(SwapArenaConformanceTest, SizeIsRoundedUpAndBaseAligned) {
  auto a = Make(1000, "small");
  ASSERT_NE(a, nullptr);
  EXPECT_GE(a->bytes(), 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->base()) % kSwapArenaAlignment, 0u);
  EXPECT_TRUE(a->Contains(a->base(), a->bytes()));
  EXPECT_FALSE(a->Contains(a->base(), a->bytes() + 1));
  EXPECT_FALSE(a->Contains(static_cast<uint8_t*>(a->base()) + a->bytes(), 1));
  EXPECT_FALSE(
      a->Contains(static_cast<uint8_t*>(a->base()) + 8, std::numeric_limits<int64_t>::max()));
  EXPECT_NE(a->Describe().find("'small'"), std::string::npos) << a->Describe();
}

TEST_P(SwapArenaConformanceTest, RefusesBadSizesNamingTheArena) {
  for (int64_t bytes : {int64_t{0}, int64_t{-5}, std::numeric_limits<int64_t>::max()}) {
    auto a = factory().backend().NewSwapArena(bytes, "weights-x");
    ASSERT_FALSE(a.ok()) << bytes;
    EXPECT_NE(a.status().message().find("weights-x"), std::string::npos) << a.status();
  }
}

TEST_P(SwapArenaConformanceTest, SwapExchangesContentAndKeepsAddresses) {
  auto live = Make(3 << 20, "live");
  ASSERT_NE(live, nullptr);
  auto twin = live->NewTwin("twin");
  ASSERT_TRUE(twin.ok()) << twin.status();
  ASSERT_EQ((*twin)->bytes(), live->bytes());
  void* const live_base = live->base();
  void* const twin_base = (*twin)->base();
  Fill(*live, 1);
  Fill(**twin, 2);
  ASSERT_TRUE(live->SwapWith(**twin).ok());
  EXPECT_EQ(live->base(), live_base);
  EXPECT_EQ((*twin)->base(), twin_base);
  EXPECT_EQ(Read(*live), Pattern(static_cast<size_t>(live->bytes()), 2));
  EXPECT_EQ(Read(**twin), Pattern(static_cast<size_t>(live->bytes()), 1));
  // Writes through either address after the swap land in the memory now
  // behind it, and a second swap brings them across.
  Fill(**twin, 3);
  ASSERT_TRUE((*twin)->SwapWith(*live).ok());
  EXPECT_EQ(Read(*live), Pattern(static_cast<size_t>(live->bytes()), 3));
  EXPECT_EQ(Read(**twin), Pattern(static_cast<size_t>(live->bytes()), 2));
}

TEST_P(SwapArenaConformanceTest, ManySwapsStayConsistent) {
  auto live = Make(64 << 10, "many");
  ASSERT_NE(live, nullptr);
  auto twin = live->NewTwin("many-twin");
  ASSERT_TRUE(twin.ok()) << twin.status();
  for (int v = 1; v <= 20; ++v) {
    Fill(**twin, static_cast<uint8_t>(v));
    ASSERT_TRUE(live->SwapWith(**twin).ok()) << v;
    ASSERT_EQ(Read(*live), Pattern(static_cast<size_t>(live->bytes()), static_cast<uint8_t>(v)))
        << v;
  }
}

TEST_P(SwapArenaConformanceTest, ASwapInTwoStepsServesTheNewBytesAfterTheFirst) {
  auto live = Make(3 << 20, "live2");
  ASSERT_NE(live, nullptr);
  auto twin = live->NewTwin("twin2");
  ASSERT_TRUE(twin.ok()) << twin.status();
  const size_t n = static_cast<size_t>(live->bytes());
  for (int v = 1; v <= 4; ++v) {
    Fill(*live, static_cast<uint8_t>(10 * v));
    Fill(**twin, static_cast<uint8_t>(v));
    ASSERT_TRUE(live->BeginSwap(**twin).ok()) << v;
    // The live range serves the twin's bytes before the twin's half is done,
    // and takes writes there.
    EXPECT_EQ(Read(*live), Pattern(n, static_cast<uint8_t>(v))) << v;
    // No second swap of either until the first is finished.
    EXPECT_EQ(live->BeginSwap(**twin).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*twin)->BeginSwap(*live).code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(live->FinishSwap(**twin).ok()) << v;
    EXPECT_EQ(Read(*live), Pattern(n, static_cast<uint8_t>(v))) << v;
    EXPECT_EQ(Read(**twin), Pattern(n, static_cast<uint8_t>(10 * v))) << v;
  }
  // Finishing what was not begun is refused, and changes nothing.
  EXPECT_EQ(live->FinishSwap(**twin).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read(*live), Pattern(n, 4));
}

TEST_P(SwapArenaConformanceTest, ATwinLeftUnfinishedIsFreedWithoutHarmingTheLiveArena) {
  auto live = Make(1 << 20, "live3");
  ASSERT_NE(live, nullptr);
  auto twin = live->NewTwin("twin3");
  ASSERT_TRUE(twin.ok()) << twin.status();
  Fill(**twin, 9);
  ASSERT_TRUE(live->BeginSwap(**twin).ok());
  twin->reset();  // dropped between the two steps
  EXPECT_EQ(Read(*live), Pattern(static_cast<size_t>(live->bytes()), 9));
  auto again = live->NewTwin("twin4");
  ASSERT_TRUE(again.ok()) << again.status();
  Fill(**again, 11);
  ASSERT_TRUE(live->SwapWith(**again).ok());
  EXPECT_EQ(Read(*live), Pattern(static_cast<size_t>(live->bytes()), 11));
  EXPECT_EQ(Read(**again), Pattern(static_cast<size_t>(live->bytes()), 9));
}

// Between the two steps the pair are partners: a second BeginSwap of
// either with another twin, and a FinishSwap naming another twin, are
// refused by name and change nothing; the right FinishSwap then completes.
TEST_P(SwapArenaConformanceTest, AnUnfinishedSwapRefusesOtherPartnersByName) {
  auto live = Make(1 << 20, "live5");
  ASSERT_NE(live, nullptr);
  auto twin = live->NewTwin("twin5");
  ASSERT_TRUE(twin.ok()) << twin.status();
  auto other = live->NewTwin("other5");
  ASSERT_TRUE(other.ok()) << other.status();
  const size_t n = static_cast<size_t>(live->bytes());
  Fill(*live, 1);
  Fill(**twin, 2);
  Fill(**other, 3);
  ASSERT_TRUE(live->BeginSwap(**twin).ok());
  EXPECT_EQ(live->swap_partner(), twin->get());
  EXPECT_EQ((*twin)->swap_partner(), live.get());
  for (const absl::Status& s : {live->BeginSwap(**other), (*other)->BeginSwap(**twin),
                                (*other)->BeginSwap(*live), live->FinishSwap(**other)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("'twin5'"), std::string::npos) << s;
    EXPECT_NE(s.message().find("'live5'"), std::string::npos) << s;
  }
  EXPECT_EQ((*twin)->FinishSwap(*live).code(), absl::StatusCode::kFailedPrecondition)
      << "finished from the side that began it";
  EXPECT_EQ(Read(*live), Pattern(n, 2));
  EXPECT_EQ(Read(**other), Pattern(n, 3));
  ASSERT_TRUE(live->FinishSwap(**twin).ok());
  EXPECT_EQ(live->swap_partner(), nullptr);
  EXPECT_EQ(Read(**twin), Pattern(n, 1));
  ASSERT_TRUE(live->SwapWith(**other).ok());
  EXPECT_EQ(Read(*live), Pattern(n, 3));
}

TEST_P(SwapArenaConformanceTest, RefusesTwinsOfAnotherSize) {
  // One byte past a's (rounded) size: another size at any granularity (a
  // CUDA arena rounds to 2 MiB, so 64 KiB and 128 KiB would be alike).
  auto a = Make(64 << 10, "a");
  ASSERT_NE(a, nullptr);
  auto b = Make(a->bytes() + 1, "b");
  ASSERT_NE(b, nullptr);
  ASSERT_NE(a->bytes(), b->bytes());
  Fill(*a, 5);
  const absl::Status s = a->SwapWith(*b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s;
  EXPECT_EQ(Read(*a), Pattern(static_cast<size_t>(a->bytes()), 5));
  EXPECT_EQ(a->SwapWith(*a).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace wsync::plane::conformance

#endif  // WSYNC_TESTS_WORKER_PLANE_SWAP_ARENA_CONFORMANCE_H_
