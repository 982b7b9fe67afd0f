// AppendSwapRuns (worker/agent/swap_runs.h) against hostile views: overflow,
// negative and zero strides, too many or too small runs, views past the
// extent, and overlapping views.
#include "worker/agent/swap_runs.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

using Runs = std::vector<std::pair<int64_t, int64_t>>;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

v1::TensorView View(int64_t offset, std::vector<int64_t> shape, std::vector<int64_t> strides,
                    v1::DType dtype = v1::UINT8) {
  v1::TensorView v;
  v.set_byte_offset(offset);
  for (int64_t s : shape) v.add_shape(s);
  for (int64_t s : strides) v.add_strides(s);
  v.set_dtype(dtype);
  v.set_side(v1::DESTINATION_BUFFER);
  return v;
}

TEST(SwapRunsTest, DenseAndStridedViewsListTheirRuns) {
  Runs runs;
  ASSERT_TRUE(AppendSwapRuns(View(16, {4, 8}, {8, 1}, v1::FP32), 1 << 20, &runs).ok());
  EXPECT_EQ(runs, (Runs{{16, 16 + 128}})) << "dense: one run";
  runs.clear();
  // 3 rows of 256 bytes, 1024 apart; a size-1 dim with any stride is ignored.
  ASSERT_TRUE(AppendSwapRuns(View(100, {1, 3, 64}, {kMax, 256, 1}, v1::FP32), 1 << 20, &runs).ok());
  EXPECT_EQ(runs, (Runs{{100, 356}, {1124, 1380}, {2148, 2404}}));
  runs.clear();
  ASSERT_TRUE(AppendSwapRuns(View(0, {3, 0, 5}, {5, 5, 1}), 10, &runs).ok());
  EXPECT_TRUE(runs.empty()) << "an empty view covers nothing";
}

TEST(SwapRunsTest, OverflowingShapesAndStridesAreRefused) {
  const std::vector<v1::TensorView> hostile = {
      View(0, {int64_t{1} << 33, 2}, {int64_t{1} << 31, 1}),  // (n - 1) * stride wraps
      View(0, {int64_t{1} << 62, 4}, {int64_t{1} << 62, 1}),
      View(0, {int64_t{1} << 40, int64_t{1} << 40}, {int64_t{1} << 30, 1}),
      View(kMax - 8, {16}, {1}),       // offset + bytes
      View(0, {kMax}, {1}, v1::FP32),  // elements * 4
      View(0, {int64_t{1} << 32, int64_t{1} << 32, 2}, {int64_t{1} << 32, 2, 1}),
  };
  for (const v1::TensorView& v : hostile) {
    Runs runs = {{0, 1}};
    const absl::Status s = AppendSwapRuns(v, kMax, &runs);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << v.DebugString() << s;
    EXPECT_EQ(runs.size(), 1u) << "nothing appended";
  }
}

TEST(SwapRunsTest, NegativeAndZeroStridesAndShapesAreRefused) {
  const std::vector<v1::TensorView> hostile = {
      View(0, {4, 256}, {-256, 1}),  // negative stride
      View(0, {4, -256}, {256, 1}),  // negative shape
      View(-8, {256}, {1}),          // negative offset
      View(0, {4, 256}, {0, 1}),     // the same bytes written four times
      View(0, {256, 4}, {4, 0}),
      View(0, {4, 256}, {256}),  // fewer strides than dims
      View(0, {4}, {1}, static_cast<v1::DType>(9999)),
  };
  for (const v1::TensorView& v : hostile) {
    Runs runs;
    const absl::Status s = AppendSwapRuns(v, 1 << 20, &runs);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << v.DebugString() << s;
    EXPECT_TRUE(runs.empty());
  }
  Runs runs;
  EXPECT_TRUE(AppendSwapRuns(View(0, {1, 256}, {0, 1}), 256, &runs).ok())
      << "stride 0 on a dim of one element is harmless";
}

TEST(SwapRunsTest, AViewPastTheExtentIsRefused) {
  Runs runs;
  EXPECT_TRUE(AppendSwapRuns(View(0, {4, 256}, {512, 1}), 3 * 512 + 256, &runs).ok());
  runs.clear();
  const absl::Status s = AppendSwapRuns(View(0, {4, 256}, {512, 1}), 3 * 512 + 255, &runs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("past the buffer's extent"), std::string::npos) << s;
  EXPECT_TRUE(runs.empty());
}

// 2^20 runs of 2 bytes (a column of a bf16 matrix) would build a million
// pairs and a million complement copies: refused, naming the sizes.
TEST(SwapRunsTest, ManyTinyRunsAreRefusedAtTheFloor) {
  Runs runs;
  const absl::Status s =
      AppendSwapRuns(View(0, {int64_t{1} << 20, 1}, {4, 1}, v1::BF16), int64_t{1} << 23, &runs);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("1048576 runs of 2 bytes"), std::string::npos) << s;
  EXPECT_TRUE(runs.empty());
  // Just under and at the floor.
  EXPECT_EQ(AppendSwapRuns(View(0, {2, kMinSwapRunBytes - 1}, {1024, 1}), 4096, &runs).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(AppendSwapRuns(View(0, {2, kMinSwapRunBytes}, {1024, 1}), 4096, &runs).ok());
  EXPECT_EQ(runs.size(), 2u);
  // One tiny run is fine: a small dense view.
  EXPECT_TRUE(AppendSwapRuns(View(8, {2}, {1}), 4096, &runs).ok());
}

TEST(SwapRunsTest, ThePartsRunCountIsBounded) {
  Runs runs(kMaxSwapRuns - 3, {0, 1});
  EXPECT_TRUE(AppendSwapRuns(View(0, {3, 256}, {512, 1}), 4096, &runs).ok());
  EXPECT_EQ(runs.size(), kMaxSwapRuns);
  const absl::Status s = AppendSwapRuns(View(0, {2, 256}, {512, 1}), 4096, &runs);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(runs.size(), kMaxSwapRuns);
}

// Overlapping views list overlapping runs; the commit's complement (sorted,
// merged: shadow_set_swap.cc) counts each byte once.
TEST(SwapRunsTest, OverlappingViewsListOverlappingRuns) {
  Runs runs;
  ASSERT_TRUE(AppendSwapRuns(View(0, {1024}, {1}), 4096, &runs).ok());
  ASSERT_TRUE(AppendSwapRuns(View(512, {2, 512}, {1024, 1}), 4096, &runs).ok());
  EXPECT_EQ(runs, (Runs{{0, 1024}, {512, 1024}, {1536, 2048}}));
}

}  // namespace
}  // namespace wsync::agent
