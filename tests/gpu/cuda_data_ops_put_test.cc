// CudaPeerWriter::Put (CudaDataOps' put path) against HostDataOps::Copy (the
// reference, common/cast.h rounding): whole destination buffers compared bit
// for bit after Fence, so writes outside a view and puts that never landed are both
// caught. Every case runs with puts all on the kernel, with the default
// copy-engine threshold, and with every put the copy engines can take sent
// there, however small.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/cast.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_peer_writer.h"
#include "worker/backends/host/host_data_ops.h"

namespace wsync::cuda {
namespace {

using testing::FirstDiff;
using testing::TwinBuffer;
using testing::View;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kBufferBytes = 128 * kMiB;

struct Side {
  int64_t offset = 0;
  DType dtype = v1::BF16;
  std::vector<int64_t> shape, strides;
};

// Bytes from a view's first element to one past its last.
int64_t Extent(const Side& v) {
  int64_t last = 0;
  for (size_t d = 0; d < v.shape.size(); ++d) last += (v.shape[d] - 1) * v.strides[d];
  return (last + 1) * DTypeSize(v.dtype);
}

// Put items described by byte offsets, resolved against host or device
// buffers, so the reference and the device get the same items.
struct PutSpec {
  std::vector<std::pair<Side, Side>> items;
  int64_t src_end = 0, dst_end = 0;
  int plain_big = 0;  // items that the default threshold sends to the copy engines

  void Add(Side s, Side d) {
    s.offset = (src_end + 255) / 256 * 256 + s.offset;
    d.offset = (dst_end + 255) / 256 * 256 + d.offset;
    src_end = s.offset + Extent(s);
    dst_end = d.offset + Extent(d);
    items.emplace_back(std::move(s), std::move(d));
  }
  std::vector<exec::CopyItem> On(void* src, void* dst) const {
    std::vector<exec::CopyItem> out;
    for (const auto& [s, d] : items) {
      out.push_back({View(src, s.offset, s.dtype, s.shape, s.strides),
                     View(dst, d.offset, d.dtype, d.shape, d.strides)});
    }
    return out;
  }
};

// What a colocated direct-write sync puts: a big contiguous tensor, a
// row-parallel half (every row's second half, into a padded destination), a
// fp32 -> bf16 cast, a big 3-D box (no 2-D form), hundreds of small pieces,
// and two items whose shapes have no common refinement (through scratch).
PutSpec MixedPuts() {
  PutSpec p;
  p.Add({0, v1::BF16, {4 * kMiB}, {1}}, {0, v1::BF16, {4 * kMiB}, {1}});  // 8 MiB
  // [2048, 8192] bf16 weight, columns [4096, 8192): 16 MiB of 8 KiB rows.
  p.Add({4096 * 2, v1::BF16, {2048, 4096}, {8192, 1}}, {0, v1::BF16, {2048, 4096}, {4160, 1}});
  p.plain_big = 2;
  // [2048, 4096] bf16 weight, columns [2048, 4096): 8 MiB, but of 4 KiB rows,
  // which the engines stream slowly: the kernel's.
  p.Add({2048 * 2, v1::BF16, {2048, 2048}, {4096, 1}}, {0, v1::BF16, {2048, 2048}, {2112, 1}});
  p.Add({0, v1::FP32, {1024, 1024}, {1024, 1}}, {0, v1::BF16, {1024, 1024}, {1024, 1}});
  p.Add({0, v1::BF16, {8, 500, 1000}, {520 * 1024, 1024, 1}},
        {0, v1::BF16, {8, 500, 1000}, {500 * 1000, 1000, 1}});
  const DType small_types[] = {v1::BF16, v1::FP16, v1::INT32, v1::FP8_E4M3, v1::FP32};
  for (int k = 0; k < 400; ++k) {
    const DType sd = small_types[k % 5];
    const DType dd = (k % 10 == 4) ? v1::BF16 : sd;  // some fp32 -> bf16 casts
    const int64_t rows = 1 + k % 7, cols = 3 + (k * 13) % 61;
    Side s{(k % 3) * DTypeSize(sd), sd, {rows, cols}, {cols + k % 5, 1}};
    if (k % 6 == 5) s.strides = {1, rows};  // a transposed source
    p.Add(std::move(s), {(k % 2) * DTypeSize(dd), dd, {rows, cols}, {cols, 1}});
  }
  p.Add({0, v1::FP16, {6, 4}, {8, 1}}, {0, v1::FP32, {4, 6}, {6, 1}});
  p.Add({0, v1::BF16, {64, 48}, {64, 1}}, {0, v1::BF16, {48, 64}, {64, 1}});
  return p;
}

class CudaPutTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    WSYNC_REQUIRE_GPUS(1);
    CudaDataOps::Options options;
    options.device = 0;
    options.put_copy_engine_min_bytes = GetParam();
    auto ops = CudaDataOps::Create(options);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = std::move(*ops);
    auto writer = CudaPeerWriter::Create(ops_.get());
    ASSERT_TRUE(writer.ok()) << writer.status();
    writer_ = std::move(*writer);
  }

  // Puts `spec` from a device-0 source into `dst` (any device) and checks
  // dst bit for bit against the host reference (left in dst.host_bytes()).
  void PutAndCheck(const PutSpec& spec, TwinBuffer& src, TwinBuffer& dst) {
    ASSERT_LT(spec.src_end, static_cast<int64_t>(src.size()));
    ASSERT_LT(spec.dst_end, static_cast<int64_t>(dst.size()));
    const int64_t copies = writer_->copy_engine_copies();
    const int64_t launches = writer_->launches();
    absl::Status s = writer_->Put(spec.On(src.dev(), dst.dev()), {}, /*alone=*/false);
    ASSERT_TRUE(s.ok()) << s;
    s = writer_->Fence();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(host_.Copy(spec.On(src.host(), dst.host())).ok());
    EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
    const int64_t new_copies = writer_->copy_engine_copies() - copies;
    if (GetParam() == 0) {
      EXPECT_EQ(new_copies, 0);
      EXPECT_GE(writer_->launches() - launches, 1);
    } else if (GetParam() == 1) {
      EXPECT_GT(new_copies, spec.plain_big) << "small plain pieces go to the engines too";
    } else {
      EXPECT_EQ(new_copies, spec.plain_big) << "only the big plain items use the engines";
    }
  }

  exec::HostDataOps host_;
  std::unique_ptr<CudaDataOps> ops_;
  std::unique_ptr<CudaPeerWriter> writer_;  // puts beside ops_
};

TEST_P(CudaPutTest, MixedPutsOnTheSameDeviceMatchHost) {
  TwinBuffer src(0, kBufferBytes, 1), dst(0, kBufferBytes, 2);
  // A Copy on the ops' stream at the same time, into other memory: both land.
  TwinBuffer local(0, 16 * kMiB, 3);
  auto local_items = [&](void* s, void* d) {
    return std::vector<exec::CopyItem>{{View(s, 0, v1::FP32, {2048, 1024}, {2048, 1}),
                                        View(d, 0, v1::BF16, {2048, 1024}, {1024, 1})}};
  };
  ASSERT_TRUE(ops_->Copy(local_items(src.dev(), local.dev())).ok());
  PutAndCheck(MixedPuts(), src, dst);
  ASSERT_TRUE(ops_->Synchronize().ok());
  ASSERT_TRUE(host_.Copy(local_items(src.host(), local.host())).ok());
  EXPECT_EQ(FirstDiff(local.Download(), local.host_bytes()), -1);
}

TEST_P(CudaPutTest, MixedPutsIntoAPeerDeviceMatchHost) {
  WSYNC_REQUIRE_GPUS(2);
  int can = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  if (!can) GTEST_SKIP() << "device 0 cannot access device 1";
  {
    DeviceGuard guard(0);
    const cudaError_t err = cudaDeviceEnablePeerAccess(1, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // not an error here; clear it
    } else {
      ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    }
  }
  TwinBuffer src(0, kBufferBytes, 4), dst(1, kBufferBytes, 5);
  PutAndCheck(MixedPuts(), src, dst);
}

TEST_P(CudaPutTest, ReplayedPutsReuseTheirTableAndMatchHost) {
  TwinBuffer src(0, kBufferBytes, 6), dst(0, kBufferBytes, 7);
  const std::vector<uint8_t> initial = dst.host_bytes();
  const PutSpec spec = MixedPuts();
  // Without the scratch items (never cached: they refer to put scratch).
  PutSpec cached = spec;
  cached.items.resize(cached.items.size() - 2);
  PutAndCheck(cached, src, dst);
  const std::vector<uint8_t> expected = dst.host_bytes();
  ASSERT_EQ(cudaMemcpy(dst.dev(), initial.data(), initial.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const int64_t hits = writer_->table_cache_hits();
  const int64_t copies = writer_->copy_engine_copies();
  // Replayed with the whole device (the cached table, launched by the other
  // grid).
  ASSERT_TRUE(writer_->Put(cached.On(src.dev(), dst.dev()), {}, /*alone=*/true).ok());
  ASSERT_TRUE(writer_->Fence().ok());
  EXPECT_EQ(writer_->table_cache_hits(), hits + 1);
  if (GetParam() > 1) {
    EXPECT_EQ(writer_->copy_engine_copies() - copies, cached.plain_big);
  }
  EXPECT_EQ(FirstDiff(dst.Download(), expected), -1);
  // The scratch items too, twice (stream-ordered scratch reuse).
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(writer_->Put(spec.On(src.dev(), dst.dev()), {}, /*alone=*/round == 1).ok());
    ASSERT_TRUE(writer_->Fence().ok());
  }
  ASSERT_TRUE(host_.Copy(spec.On(src.host(), dst.host())).ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

TEST_P(CudaPutTest, FenceWithNothingIssuedIsOk) {
  EXPECT_NE(writer_->put_stream(), ops_->stream());
  absl::Status s = writer_->Fence();
  EXPECT_TRUE(s.ok()) << s;
  s = writer_->Put({}, {}, /*alone=*/false);
  EXPECT_TRUE(s.ok()) << s;
  s = writer_->Fence();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(writer_->launches(), 0);
  EXPECT_EQ(writer_->copy_engine_copies(), 0);
  EXPECT_TRUE(ops_->Synchronize().ok());
}

TEST_P(CudaPutTest, BadItemsAreErrorsNamingTheItemAndWriteNothing) {
  TwinBuffer src(0, 16 * kMiB, 8), dst(0, 16 * kMiB, 9);
  const exec::CopyItem good{View(src.dev(), 0, v1::BF16, {4 * kMiB}, {1}),
                            View(dst.dev(), 0, v1::BF16, {4 * kMiB}, {1})};
  const exec::CopyItem mismatched{View(src.dev(), 0, v1::BF16, {4, 6}, {6, 1}),
                                  View(dst.dev(), 8 * kMiB + 256, v1::BF16, {5, 6}, {6, 1})};
  absl::Status s = writer_->Put(std::vector<exec::CopyItem>{good, mismatched}, {}, /*alone=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("put item 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("element count mismatch"), std::string::npos) << s;

  const exec::CopyItem bad_cast{View(src.dev(), 0, v1::INT32, {4}, {1}),
                                View(dst.dev(), 8 * kMiB, v1::FP32, {4}, {1})};
  s = writer_->Put(std::vector<exec::CopyItem>{bad_cast, good}, {}, /*alone=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("put item 0"), std::string::npos) << s;

  exec::CopyItem null_dst = good;
  null_dst.dst.data = nullptr;
  s = writer_->Put(std::vector<exec::CopyItem>{good, good, null_dst}, {}, /*alone=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("put item 2"), std::string::npos) << s;

  s = writer_->Fence();
  EXPECT_TRUE(s.ok()) << s;
  // Items are all checked before any is enqueued: `good` never ran.
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

INSTANTIATE_TEST_SUITE_P(PutEngines, CudaPutTest,
                         ::testing::Values(int64_t{0}, int64_t{4} << 20, int64_t{1}),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           if (info.param == 0) return std::string("Kernel");
                           if (info.param == 1) return std::string("AllCopyEngine");
                           return std::string("DefaultThreshold");
                         });

}  // namespace
}  // namespace wsync::cuda
