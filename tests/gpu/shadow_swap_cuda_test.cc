// Remappable CUDA arenas (worker/backends/cuda/cuda_swap_arena.h) through the
// SwapArena suite, and swap commits through ShadowSet over them
// (docs/commit-swap.md), and flip commits (docs/commit-flip.md). Run with
// scripts/gpu_run.sh.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "tests/worker/agent/shadow_flip_suite.h"
#include "tests/worker/agent/shadow_swap_suite.h"
#include "tests/worker/plane/swap_arena_conformance.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_handles.h"

namespace wsync {
namespace {

std::string NoGpu() {
  auto count = cuda::DeviceCount();
  if (!count.ok()) return std::string(count.status().message());
  return *count < 1 ? "needs a GPU" : "";
}

// Device 0's backend, made on first use (a machine without a GPU skips).
class Device0 {
 public:
  plane::Backend& get() {
    if (backend_ == nullptr) {
      auto b = cuda::CudaBackend::Create(0, {});
      EXPECT_TRUE(b.ok()) << b.status();
      if (b.ok()) backend_ = std::move(*b);
    }
    return *backend_;
  }
  static void Write(void* dst, const void* host, size_t bytes) {
    EXPECT_EQ(cudaMemcpy(dst, host, bytes, cudaMemcpyDefault), cudaSuccess);
  }
  static void Read(void* host, const void* src, size_t bytes) {
    EXPECT_EQ(cudaMemcpy(host, src, bytes, cudaMemcpyDefault), cudaSuccess);
  }

 private:
  std::unique_ptr<cuda::CudaBackend> backend_;
};

class CudaArenas : public plane::conformance::SwapArenaTestFactory {
 public:
  std::string Name() const override { return "Cuda"; }
  std::string Unavailable() override { return NoGpu(); }
  plane::Backend& backend() override { return device_.get(); }
  void Write(void* dst, const void* host, size_t bytes) override {
    Device0::Write(dst, host, bytes);
  }
  void Read(void* host, const void* src, size_t bytes) override { Device0::Read(host, src, bytes); }

 private:
  Device0 device_;
};

class CudaSwap : public agent::ShadowSwapFactory {
 public:
  std::string Name() const override { return "Cuda"; }
  std::string Unavailable() override { return NoGpu(); }
  plane::Backend& backend() override { return device_.get(); }
  transport::MemorySpace space() const override { return transport::MemorySpace::kCuda; }
  void Write(void* dst, const void* host, size_t bytes) override {
    Device0::Write(dst, host, bytes);
  }
  void Read(void* host, const void* src, size_t bytes) override { Device0::Read(host, src, bytes); }

 private:
  Device0 device_;
};

}  // namespace

namespace plane::conformance {
INSTANTIATE_TEST_SUITE_P(Cuda, SwapArenaConformanceTest,
                         ::testing::Values(std::make_shared<CudaArenas>()),
                         SwapArenaConformanceTest::ParamName);
}  // namespace plane::conformance

namespace agent {
INSTANTIATE_TEST_SUITE_P(Cuda, ShadowSwapTest, ::testing::Values(std::make_shared<CudaSwap>()),
                         ShadowSwapTest::ParamName);
INSTANTIATE_TEST_SUITE_P(Cuda, ShadowFlipTest, ::testing::Values(std::make_shared<CudaSwap>()),
                         ShadowFlipTest::ParamName);
}  // namespace agent

}  // namespace wsync
