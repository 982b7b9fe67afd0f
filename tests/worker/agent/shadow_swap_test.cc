// Swap commits through ShadowSet over the host backend's memfd arenas
// (tests/worker/agent/shadow_swap_suite.h).
#include "tests/worker/agent/shadow_swap_suite.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

class HostSwap : public ShadowSwapFactory {
 public:
  std::string Name() const override { return "Host"; }
  plane::Backend& backend() override { return backend_; }
  transport::MemorySpace space() const override { return transport::MemorySpace::kHost; }

 private:
  host::HostBackend backend_{plane::BackendConfig()};
};

INSTANTIATE_TEST_SUITE_P(Host, ShadowSwapTest, ::testing::Values(std::make_shared<HostSwap>()),
                         ShadowSwapTest::ParamName);

}  // namespace
}  // namespace wsync::agent
