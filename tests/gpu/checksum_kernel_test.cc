// The GPU bucket checksum (CudaDataOps::Checksum, checksum_kernel.cu) against
// its host twin, common/chunk_hash.h: equal at every size class, and the
// host-shadow allocation reachable by the kernels; unaligned ranges and the
// queued form (Reset/Queue/CollectChecksums). Run with scripts/gpu_run.sh.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

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

TEST(ChecksumKernelTest, UnalignedRangesAndQueuedSlotsEqualTheHostHash) {
  WSYNC_REQUIRE_GPUS(1);
  auto ops = CudaDataOps::Create(CudaDataOps::Options());
  ASSERT_TRUE(ops.ok()) << ops.status();
  TwinBuffer buf(0, (size_t{1} << 20) + 64, 17);
  const auto* dev = static_cast<const unsigned char*>(buf.dev());
  // (offset, bytes): odd starts take the kernel's byte loads; one slot left
  // unqueued hashes 0 bytes.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 1 << 20}, {1, 4095}, {3, (1 << 20) + 13}, {7, 8}, {8, 7}, {5, 1}};
  ASSERT_TRUE((*ops)->ResetChecksums(static_cast<int64_t>(ranges.size()) + 1).ok());
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_TRUE(
        (*ops)
            ->QueueChecksum(dev + ranges[i].first, ranges[i].second, static_cast<int64_t>(i))
            .ok());
  }
  auto hashes = (*ops)->CollectChecksums();
  ASSERT_TRUE(hashes.ok()) << hashes.status();
  ASSERT_EQ(hashes->size(), ranges.size() + 1);
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ((*hashes)[i], chunk_hash::Hash(buf.host() + ranges[i].first, ranges[i].second))
        << "offset " << ranges[i].first << ", " << ranges[i].second << " bytes";
    auto single = (*ops)->Checksum(dev + ranges[i].first, ranges[i].second);
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(*single, (*hashes)[i]);
  }
  EXPECT_EQ(hashes->back(), chunk_hash::Hash(nullptr, 0));
  EXPECT_EQ((*ops)->QueueChecksum(buf.dev(), 8, 99).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wsync::cuda
