// The helpers of the direct-write tests (direct_writes_test.cc,
// direct_writes_faults_test.cc): a two-worker swap plan (strided fp32 ->
// bf16 both ways, a zero-copy half, local copies), its check, one-bucket
// plans and checks that a destination was not written.
#ifndef WSYNC_TESTS_WORKER_EXEC_DIRECT_WRITES_FIXTURE_H_
#define WSYNC_TESTS_WORKER_EXEC_DIRECT_WRITES_FIXTURE_H_

#include <array>
#include <cstdint>

#include "common/cast.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/plan_builder.h"

namespace wsync::exec::direct_writes_testing {

using testing::Cluster;
using testing::kSentinel;
using testing::Piece;
using testing::PlanBuilder;
using testing::View;
inline constexpr BufferSide kSrc = BufferSide::kSource;
inline constexpr BufferSide kDst = BufferSide::kDestination;

inline float Value(int w, int64_t i) {
  return static_cast<float>(w * 1000 + i % 997) * 0.5f - 3.25f;
}

// Two colocated workers swap row-parallel halves (strided on both sides,
// fp32 -> bf16 at the writer), a contiguous zero-copy half, and each copies
// its own half locally: the colocated FSDP -> TP pattern.
inline v1::Plan SwapPlan(int64_t rows, int64_t cols, int rounds) {
  PlanBuilder pb;
  const int64_t half = cols / 2;
  for (int w = 0; w < 2; ++w) {
    for (int r = 0; r < rounds; ++r) {
      const int64_t r0 = rows * r / rounds, n = rows * (r + 1) / rounds - r0;
      // My rows r0.., the peer's column half -> the peer's rows of my block.
      const int64_t src_col = (1 - w) * half;
      pb.AddBucket(w, 1 - w, r,
                   {Piece(View("m", (r0 * cols + src_col) * 4, {n, half}, v1::FP32, {cols, 1}),
                          View("m", ((w * rows + r0) * half) * 2, {n, half}, v1::BF16), v1::BF16)});
      pb.AddBucket(
          w, w, r,
          {Piece(View("m", (r0 * cols + w * half) * 4, {n, half}, v1::FP32, {cols, 1}),
                 View("m", ((w * rows + r0) * half) * 2 + 0, {n, half}, v1::BF16), v1::BF16)});
    }
    pb.AddBucket(w, 1 - w, 0,
                 {Piece(View("z", w * 512 * 2, {512}, v1::BF16),
                        View("z", w * 512 * 2, {512}, v1::BF16), v1::BF16)},
                 /*zero_copy=*/true);
  }
  return pb.Build();
}

inline void CheckSwap(Cluster& c, int64_t rows, int64_t cols) {
  const int64_t half = cols / 2;
  for (int w = 0; w < 2; ++w) {
    // Destination "m" of worker w: [2 * rows, half] = rows of worker 0, then
    // of worker 1, each restricted to w's column half.
    const uint16_t* d = c.Data<uint16_t>(w, kDst, "m");
    for (int from = 0; from < 2; ++from) {
      const float* s = c.Data<float>(from, kSrc, "m");
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < half; ++j) {
          ASSERT_EQ(d[(from * rows + i) * half + j], FloatToBf16(s[i * cols + w * half + j]))
              << "worker " << w << " rows of " << from << " (" << i << "," << j << ")";
        }
      }
    }
    const uint16_t* z = c.Data<uint16_t>(w, kDst, "z");
    const uint16_t* zs = c.Data<uint16_t>(1 - w, kSrc, "z");
    for (int64_t i = 0; i < 1024; ++i) {
      const bool written = i / 512 == 1 - w;
      if (written) {
        ASSERT_EQ(z[i], zs[i]) << "worker " << w << " z " << i;
      } else {
        ASSERT_EQ(z[i], kSentinel << 8 | kSentinel) << "worker " << w << " z " << i;
      }
    }
  }
}

inline void SetUpSwap(Cluster& c, int64_t rows, int64_t cols) {
  for (int w = 0; w < 2; ++w) {
    c.Add(w, kSrc, "m", v1::FP32, rows * cols);
    c.Add(w, kDst, "m", v1::BF16, 2 * rows * cols / 2);
    c.Add(w, kSrc, "z", v1::BF16, 1024);
    c.Add(w, kDst, "z", v1::BF16, 1024);
    float* s = c.Data<float>(w, kSrc, "m");
    for (int64_t i = 0; i < rows * cols; ++i) s[i] = Value(w, i);
    uint16_t* zs = c.Data<uint16_t>(w, kSrc, "z");
    for (int64_t i = 0; i < 1024; ++i) zs[i] = static_cast<uint16_t>(i * 31 + w + 1);
  }
}

// Worker 0's fp32 source "s" -> worker 1's destination "s" (n elements),
// one bucket.
inline v1::Plan OneBucket(Cluster& c, int64_t n) {
  c.Add(0, kSrc, "s", v1::FP32, n);
  c.Add(1, kDst, "s", v1::FP32, n);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("s", 0, {n}, v1::FP32), View("s", 0, {n}, v1::FP32), v1::FP32)});
  return pb.Build();
}

// Every byte of worker 1's n-element fp32 destination `name` still holds
// its sentinel.
inline void ExpectUnwrittenBuffer(Cluster& c, const char* name, int64_t n = 64) {
  const uint8_t* d = c.Data<uint8_t>(1, kDst, name);
  for (int64_t i = 0; i < n * 4; ++i) {
    ASSERT_EQ(d[i], kSentinel) << name << " byte " << i << " written";
  }
}

// Every byte of worker 1's destination "s" still holds its sentinel.
inline void ExpectUnwritten(Cluster& c, int64_t n) { ExpectUnwrittenBuffer(c, "s", n); }

// The swap of SetUpSwap with both workers writing each other directly, each
// on `ops[w]` where given (null: the cluster's own data ops), connected.
inline absl::Status ConnectDirectSwap(Cluster& c, int64_t rows, int64_t cols,
                                      std::array<DataOps*, 2> ops = {nullptr, nullptr},
                                      ExecutorOptions options = {}) {
  SetUpSwap(c, rows, cols);
  for (int w = 0; w < 2; ++w) {
    if (ops[w] != nullptr) c.UseOps(w, ops[w]);
  }
  c.WriteDirectly(0, 1);
  c.WriteDirectly(1, 0);
  return c.Connect(options);
}

}  // namespace wsync::exec::direct_writes_testing

#endif  // WSYNC_TESTS_WORKER_EXEC_DIRECT_WRITES_FIXTURE_H_
