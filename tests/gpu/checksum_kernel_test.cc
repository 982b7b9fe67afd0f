// The GPU bucket checksum (CudaDataOps::Checksum, checksum_kernel.cu) against
// its host twin, common/chunk_hash.h: equal at every size class, and the
// host-shadow allocation reachable by the kernels. Written without a GPU:
// run with scripts/gpu_run.sh.
#include <gtest/gtest.h>

#include "common/chunk_hash.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/cuda_data_ops.h"

namespace wsync::cuda {
namespace {

using testing::TwinBuffer;

TEST(ChecksumKernelTest, EqualsTheHostHashAtEverySizeClass) {
  WSYNC_REQUIRE_GPUS(1);
  CudaDataOps::Options options;
  auto ops = CudaDataOps::Create(options);
  ASSERT_TRUE(ops.ok()) << ops.status();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{4095}, int64_t{4096}, int64_t{4097},
                    int64_t{256} * 4096 + 3, int64_t{3} << 20}) {
    TwinBuffer buf(0, static_cast<size_t>(n), static_cast<uint32_t>(n));
    auto h = (*ops)->Checksum(buf.dev(), n);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(*h, chunk_hash::Hash(buf.host(), n)) << n << " bytes";
  }
}

TEST(ChecksumKernelTest, HashesHostShadowMemory) {
  WSYNC_REQUIRE_GPUS(1);
  auto ops = CudaDataOps::Create(CudaDataOps::Options());
  ASSERT_TRUE(ops.ok()) << ops.status();
  auto shadow = (*ops)->AllocateHostShadow(10000);
  ASSERT_TRUE(shadow.ok()) << shadow.status();
  auto* p = static_cast<unsigned char*>(shadow->data());
  for (int i = 0; i < 10000; ++i) p[i] = static_cast<unsigned char>(i * 31);
  auto h = (*ops)->Checksum(p, 10000);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, chunk_hash::Hash(p, 10000));
}

}  // namespace
}  // namespace wsync::cuda
