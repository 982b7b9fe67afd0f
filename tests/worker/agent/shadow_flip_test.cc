// Flip commits through ShadowSet over the host backend's arenas
// (tests/worker/agent/shadow_flip_suite.h), and the tensor table's rebase
// that hands the owner's registered tensors over to the partner.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/agent/shadow_flip_suite.h"
#include "worker/agent/tensor_table.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

class HostFlip : public ShadowSwapFactory {
 public:
  std::string Name() const override { return "Host"; }
  plane::Backend& backend() override { return backend_; }
  transport::MemorySpace space() const override { return transport::MemorySpace::kHost; }

 private:
  host::HostBackend backend_{plane::BackendConfig()};
};

// The swap suite (whose factory this binary reuses) runs in wsync_shadow_swap_test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ShadowSwapTest);

INSTANTIATE_TEST_SUITE_P(Host, ShadowFlipTest, ::testing::Values(std::make_shared<HostFlip>()),
                         ShadowFlipTest::ParamName);

LocalTensor Local(const std::string& name, uint8_t* data, int64_t bytes) {
  LocalTensor t;
  t.reg.set_name(name);
  t.reg.set_dtype(v1::UINT8);
  t.reg.add_shape(bytes);
  t.data = data;
  t.bytes = bytes;
  return t;
}

TEST(TensorTableRebaseTest, MovesTheEntriesInsideTheRangeOnly) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable table({"inference"}, &backend);
  std::vector<uint8_t> from(4096), to(4096), elsewhere(64);
  std::vector<LocalTensor> tensors = {Local("a", from.data(), 1024),
                                      Local("b", from.data() + 2048, 2048),
                                      Local("c", elsewhere.data(), 64)};
  ASSERT_TRUE(table.RegisterLocal("inference", std::move(tensors), false).ok());
  const uint64_t before = table.version();
  auto hold = std::make_shared<int>(7);
  EXPECT_EQ(table.Rebase(from.data(), 4096, to.data(), hold), 2);
  EXPECT_NE(table.version(), before);
  std::map<std::string, TensorEntry> got;
  for (const TensorEntry& e : table.Snapshot().tensors) got[e.reg.name()] = e;
  EXPECT_EQ(got["a"].data, to.data());
  EXPECT_EQ(got["b"].data, to.data() + 2048);
  EXPECT_EQ(got["b"].arena_hold, hold);
  EXPECT_EQ(got["c"].data, elsewhere.data());
  // A range that holds part of b only moves nothing; nothing moved: same version.
  const uint64_t after = table.version();
  EXPECT_EQ(table.Rebase(to.data() + 2048, 1024, from.data(), hold), 0);
  EXPECT_EQ(table.version(), after);
  // A range past the address space's end is refused, not wrapped.
  EXPECT_EQ(table.Rebase(reinterpret_cast<void*>(UINTPTR_MAX - 16), 4096, to.data(), hold), 0);
  EXPECT_EQ(table.Rebase(from.data(), -1, to.data(), hold), 0);
}

}  // namespace
}  // namespace wsync::agent
