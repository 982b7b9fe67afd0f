// The host arenas (memfd remaps) through the SwapArena suite, and what only
// host memory shows: a pointer taken before a swap reads the new data.
#include "worker/backends/host/host_swap_arena.h"

#include <cstring>

#include "gtest/gtest.h"
#include "tests/worker/plane/swap_arena_conformance.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::plane::conformance {
namespace {

class HostArenas : public SwapArenaTestFactory {
 public:
  std::string Name() const override { return "Host"; }
  Backend& backend() override { return backend_; }

 private:
  host::HostBackend backend_{BackendConfig()};
};

INSTANTIATE_TEST_SUITE_P(Host, SwapArenaConformanceTest,
                         ::testing::Values(std::make_shared<HostArenas>()),
                         SwapArenaConformanceTest::ParamName);

TEST(HostSwapArenaTest, AnOutstandingPointerSeesTheSwappedData) {
  auto live = host::NewHostSwapArena(10000, "w");
  ASSERT_TRUE(live.ok()) << live.status();
  auto twin = (*live)->NewTwin("w-twin");
  ASSERT_TRUE(twin.ok()) << twin.status();
  auto* weights = static_cast<volatile float*>((*live)->base()) + 100;
  *weights = 1.5f;
  static_cast<float*>((*twin)->base())[100] = 2.5f;
  ASSERT_TRUE((*live)->SwapWith(**twin).ok());
  EXPECT_EQ(*weights, 2.5f);
  EXPECT_EQ(static_cast<float*>((*twin)->base())[100], 1.5f);
}

TEST(HostSwapArenaTest, ALongNameIsCutForTheMemfdNotRefused) {
  const std::string name(400, 'w');
  auto arena = host::NewHostSwapArena(4096, name);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_NE((*arena)->Describe().find(name), std::string::npos) << "errors keep the whole name";
}

}  // namespace
}  // namespace wsync::plane::conformance
