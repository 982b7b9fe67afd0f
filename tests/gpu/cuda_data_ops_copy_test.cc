// CudaDataOps: large, narrow and prepared copies, bad items, staging and
// retirement (the packs, unpacks, conversions, reduces and quantization are
// in cuda_data_ops_test.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "tests/gpu/cuda_data_ops_fixture.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/host/host_data_ops.h"

namespace wsync::cuda {
namespace {

using testing::FirstDiff;
using testing::TwinBuffer;
using testing::View;
using testing_ops::CudaDataOpsTest;

TEST_F(CudaDataOpsTest, LargeAlignedAndMisalignedCopiesMatchHost) {
  const int64_t bytes = 64 << 20;
  TwinBuffer src(0, bytes + 64, 13), dst(0, bytes + 64, 14);
  auto items = [&](void* s, void* d) {
    return std::vector<exec::CopyItem>{
        {View(s, 0, v1::BF16, {bytes / 4}, {1}), View(d, 0, v1::BF16, {bytes / 4}, {1})},
        {View(s, bytes / 2 + 2, v1::BF16, {bytes / 8 - 3}, {1}),
         View(d, bytes / 2 + 6, v1::BF16, {bytes / 8 - 3}, {1})}};
  };
  ASSERT_TRUE(host_.Copy(items(src.host(), dst.host())).ok());
  ASSERT_TRUE(ops_->Copy(items(src.dev(), dst.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

// Rows narrower than a warp item (256 units of 16 bytes) are copied with a
// warp item spanning rows: widths around the 32-lane stride and the item
// size, tasks of many rows, 3-D pieces, and pitches wider on either side.
TEST_F(CudaDataOpsTest, NarrowRowCopiesMatchHost) {
  TwinBuffer src(0, 64 << 20, 21), dst(0, 64 << 20, 22);
  auto items = [&](void* s, void* d) {
    std::vector<exec::CopyItem> out;
    int64_t so = 0, dof = 0;
    for (int64_t units : {1, 2, 3, 16, 31, 33, 47, 48, 100, 255}) {
      for (int64_t rows : {2, 7, 1000, 5000}) {
        const int64_t w = units * 8;  // bf16 elements per row
        const int64_t spitch = w + 8 * (1 + rows % 3), dpitch = w + 8 * (units % 2);
        out.push_back({View(s, so, v1::BF16, {rows, w}, {spitch, 1}),
                       View(d, dof, v1::BF16, {rows, w}, {dpitch, 1})});
        so += rows * spitch * 2;
        dof += rows * dpitch * 2;
      }
    }
    // 3-D: [4, 300, 48 units] from a wider source, into a wider destination.
    out.push_back({View(s, so, v1::FP32, {4, 300, 192}, {300 * 200, 200, 1}),
                   View(d, dof, v1::FP32, {4, 300, 192}, {301 * 196, 196, 1})});
    so += 4 * 300 * 200 * 4;
    dof += 4 * 301 * 196 * 4;
    EXPECT_LT(so, 64 << 20);
    EXPECT_LT(dof, 64 << 20);
    return out;
  };
  ASSERT_TRUE(host_.Copy(items(src.host(), dst.host())).ok());
  ASSERT_TRUE(ops_->Copy(items(src.dev(), dst.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

// A prepared list (exec::ItemsHandle) replays its table under the handle. A
// new handle for the same items (a plan bound again over the same buffers)
// finds their table by the items; a handle for other items does not.
TEST_F(CudaDataOpsTest, PreparedCopiesReplayUnderTheirHandle) {
  TwinBuffer src(0, 1 << 20, 23), dst(0, 1 << 20, 24);
  auto items = [&](void* s, void* d) {
    return std::vector<exec::CopyItem>{
        {View(s, 0, v1::BF16, {64, 300}, {512, 1}), View(d, 0, v1::BF16, {64, 300}, {304, 1})},
        {View(s, 65536, v1::FP32, {1000}, {1}), View(d, 65536, v1::BF16, {1000}, {1})}};
  };
  ASSERT_TRUE(host_.Copy(items(src.host(), dst.host())).ok());
  const std::vector<exec::CopyItem> list = items(src.dev(), dst.dev());
  const exec::ItemsHandle name = ops_->Prepare(list);
  const int64_t hits = ops_->table_cache_hits();
  ASSERT_TRUE(ops_->Copy(list, name).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
  EXPECT_EQ(ops_->table_cache_hits(), hits);
  dst.Upload();  // back to the initial bytes
  ASSERT_TRUE(ops_->Copy(list, name).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(ops_->table_cache_hits(), hits + 1);
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
  ASSERT_TRUE(ops_->Copy(list, ops_->Prepare(list)).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(ops_->table_cache_hits(), hits + 2) << "a new handle for the same items";
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
  std::vector<exec::CopyItem> other = list;
  other.pop_back();
  ASSERT_TRUE(ops_->Copy(other, ops_->Prepare(other)).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(ops_->table_cache_hits(), hits + 2) << "other items under a new handle";
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

TEST_F(CudaDataOpsTest, BadItemsAreErrorsNamingTheItem) {
  TwinBuffer buf(0, 4096, 15);
  std::vector<exec::CopyItem> bad_cast = {
      {View(buf.dev(), 0, v1::INT32, {4}, {1}), View(buf.dev(), 64, v1::FP32, {4}, {1})}};
  absl::Status s = ops_->Copy(bad_cast);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::vector<exec::CopyItem> bad_count = {
      {View(buf.dev(), 0, v1::BF16, {4}, {1}), View(buf.dev(), 64, v1::BF16, {5}, {1})}};
  s = ops_->Copy(bad_count);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("copy item 0"), std::string::npos) << s;
  std::vector<exec::PackItem> null_staging = {
      {View(buf.dev(), 0, v1::BF16, {4}, {1}), 0, v1::BF16}};
  EXPECT_EQ(ops_->Pack(null_staging, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ops_->Synchronize().ok());
}

TEST_F(CudaDataOpsTest, StagingIsPooledAndAligned) {
  void* first = nullptr;
  {
    auto a = ops_->AllocateStaging(100 << 20);
    ASSERT_TRUE(a.ok()) << a.status();
    first = a->data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 256, 0u);
  }
  auto b = ops_->AllocateStaging(90 << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first) << "a freed staging buffer is reused";
  auto c = ops_->AllocateStaging(int64_t{1} << 50);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
}

// Calls the executor issues beside a transfer must not free device memory:
// cudaFree waits for the whole device, so a NCCL kernel waiting on a dead
// peer would hold the call past every deadline (retired_memory.h). Another
// stream held by a blocked host function stands in for that kernel. Tables
// outgrowing a one-byte cache and growing scratch are retired instead, and
// freed by Synchronize().
TEST(CudaDataOpsRetireTest, CallsBesideAHeldStreamDoNotWaitForIt) {
  WSYNC_REQUIRE_GPUS(1);
  CudaDataOps::Options options;
  options.device = 0;
  options.table_cache_bytes = 1;  // every new table clears the cache
  auto ops = CudaDataOps::Create(options);
  ASSERT_TRUE(ops.ok()) << ops.status();
  exec::HostDataOps host;
  TwinBuffer src(0, 1 << 20, 21), dst(0, 1 << 20, 22);
  // Call 2k: padded rows reshaped (neither side coalesces; where the shapes
  // have no common refinement the copy is staged through scratch, which
  // grows with k). Call 2k+1: padded rows to padded rows at an offset of its
  // own, a new cached table each time, pushing the last one out.
  auto items = [](void* s, void* d, int call) {
    const int k = call / 2;
    const int64_t rows = 16 * (k + 1), cols = 24;
    if (call % 2 == 1) {
      return std::vector<exec::CopyItem>{
          {View(s, (64 + k) * 8192, v1::BF16, {rows, cols}, {cols + 8, 1}),
           View(d, (64 + k) * 8192, v1::BF16, {rows, cols}, {cols + 8, 1})}};
    }
    return std::vector<exec::CopyItem>{{View(s, k * 8192, v1::BF16, {rows, cols}, {cols + 8, 1}),
                                        View(d, k * 8192, v1::BF16, {cols, rows}, {rows + 8, 1})}};
  };
  cudaStream_t held = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> release{false};
  ASSERT_EQ(cudaLaunchHostFunc(
                held,
                [](void* p) {
                  auto* r = static_cast<std::atomic<bool>*>(p);
                  while (!r->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                },
                &release),
            cudaSuccess);
  std::atomic<bool> issued{false};
  absl::Status issue_status;
  std::thread caller([&] {
    for (int call = 0; call < 8 && issue_status.ok(); ++call) {
      issue_status = (*ops)->Copy(items(src.dev(), dst.dev(), call));
    }
    issued = true;
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!issued.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  const bool in_time = issued.load();
  release = true;  // never leave the test hung, whatever happened
  caller.join();
  ASSERT_EQ(cudaStreamSynchronize(held), cudaSuccess);
  cudaStreamDestroy(held);
  EXPECT_TRUE(in_time) << "a call waited for another stream (it freed device memory)";
  ASSERT_TRUE(issue_status.ok()) << issue_status;
  EXPECT_GE((*ops)->retired_buffers(), 3u) << "old scratch and pushed-out tables";
  ASSERT_TRUE((*ops)->Synchronize().ok());
  EXPECT_EQ((*ops)->retired_buffers(), 0u);
  for (int call = 0; call < 8; ++call) {
    ASSERT_TRUE(host.Copy(items(src.host(), dst.host(), call)).ok());
  }
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

}  // namespace
}  // namespace wsync::cuda
