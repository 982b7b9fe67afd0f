// Staged syncs' shadows on the CUDA backend (docs/staging.md): ShadowSet over
// device memory with device shadows (AllocateStaging) and host shadows
// (AllocateHostShadow: pinned, mapped), filled from live, committed through
// CudaDataOps copies of exactly the written views. The host-backend twin is
// tests/worker/agent/staged_test.cc. Run with scripts/gpu_run.sh.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "worker/agent/shadow_set.h"
#include "worker/backends/cuda/cuda_backend.h"

namespace wsync::agent {
namespace {

v1::TensorView Range(int64_t offset, int64_t bytes) {
  v1::TensorView v;
  v.set_byte_offset(offset);
  v.add_shape(bytes);
  v.add_strides(1);
  v.set_dtype(v1::UINT8);
  v.set_side(v1::DESTINATION_BUFFER);
  return v;
}

class ShadowSetCudaTest : public ::testing::TestWithParam<v1::StagingMode> {};

TEST_P(ShadowSetCudaTest, LiveKeepsServingUntilTheCommitCopiesTheWrittenViews) {
  WSYNC_REQUIRE_GPUS(1);
  auto backend = cuda::CudaBackend::Create(0, {});
  ASSERT_TRUE(backend.ok()) << backend.status();
  constexpr int64_t kBytes = int64_t{3} << 20;  // several copy kernels' worth
  void* live = nullptr;
  ASSERT_EQ(cudaMalloc(&live, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(live, 1, kBytes), cudaSuccess);
  exec::BufferRegistry registry;
  exec::RegisteredBuffer b{live, kBytes, v1::UINT8, transport::MemorySpace::kCuda};
  ASSERT_TRUE(registry.Register(exec::BufferSide::kDestination, "inference/w", b).ok());
  // A dense range and a strided 2 x 4096 view (rows 8192 apart) at 1 MiB.
  v1::TensorView strided = Range(1 << 20, 0);
  strided.clear_shape();
  strided.clear_strides();
  for (int64_t d : {2, 4096}) strided.add_shape(d);
  for (int64_t d : {8192, 1}) strided.add_strides(d);
  const int64_t extent = (int64_t{1} << 20) + 8192 + 4096;
  std::map<std::string, BufferWrites> writes{
      {"inference/w", BufferWrites{extent, {Range(0, 65536), strided}}}};
  ShadowSet set(backend->get(), 0);
  ASSERT_TRUE(set.Prepare(writes, GetParam(), registry, "gpu worker 0").ok());
  EXPECT_EQ(set.bytes(), extent);
  void* shadow = set.registry().Find(exec::BufferSide::kDestination, "inference/w")->data;
  ASSERT_NE(shadow, live);
  std::vector<unsigned char> host(extent);
  ASSERT_EQ(cudaMemcpy(host.data(), shadow, extent, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(host[0], 1);
  EXPECT_EQ(host[extent - 1], 1) << "filled from live";
  ASSERT_EQ(cudaMemset(shadow, 7, extent), cudaSuccess);  // the sync writes the shadow
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> out(kBytes);
  ASSERT_EQ(cudaMemcpy(out.data(), live, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out[0], 1) << "the live tensor keeps serving the old bytes";
  ASSERT_TRUE(set.Commit().ok());
  EXPECT_EQ(set.commit_bytes(), 65536 + 2 * 4096);
  ASSERT_EQ(cudaMemcpy(out.data(), live, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < kBytes; ++i) {
    const int64_t r = i - (int64_t{1} << 20);
    const bool written = i < 65536 || (r >= 0 && r < 2 * 8192 && r % 8192 < 4096);
    ASSERT_EQ(out[i], written ? 7 : 1) << "byte " << i;
  }
  cudaFree(live);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShadowSetCudaTest,
                         ::testing::Values(v1::STAGING_DEVICE_SHADOW, v1::STAGING_HOST_SHADOW),
                         [](const auto& info) {
                           return info.param == v1::STAGING_HOST_SHADOW ? "HostShadow"
                                                                        : "DeviceShadow";
                         });

}  // namespace
}  // namespace wsync::agent
