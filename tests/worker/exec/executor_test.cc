#include "worker/exec/executor.h"

#include <cmath>
#include <thread>

#include "common/cast.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/plan_builder.h"

namespace wsync::exec::testing {
namespace {

// Registers fp32 tensor "s" of `n` elements as worker 0's source and worker
// `dst`'s destination; the plan moves it in one bucket (bucket 0).
v1::Plan OneFloatBucket(Cluster& c, int32_t dst, int64_t n) {
  c.Add(0, kSrc, "s", v1::FP32, n);
  c.Add(dst, kDst, "s", v1::FP32, n);
  PlanBuilder pb;
  pb.AddBucket(0, dst, 0,
               {Piece(View("s", 0, {n}, v1::FP32), View("s", 0, {n}, v1::FP32), v1::FP32)});
  return pb.Build();
}

void FillFloats(float* p, int64_t n, float base) {
  for (int64_t i = 0; i < n; ++i) p[i] = base + 0.37f * static_cast<float>(i) - 1.0f / (i + 3);
}

bool IsSentinel16(uint16_t v) { return v == (kSentinel << 8 | kSentinel); }

void ExpectAllOk(const std::vector<absl::StatusOr<SyncStats>>& results) {
  for (size_t w = 0; w < results.size(); ++w) {
    EXPECT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w].status();
  }
}

// Worker 0 (fp32 trainer) -> worker 1 (bf16): row block plus a strided column
// block in one bucket, cast at the sender; untouched elements stay untouched.
TEST(ExecutorTest, SendRecvWithStridedPiecesAndCastAtSender) {
  Cluster c(2);
  c.Add(0, kSrc, "w", v1::FP32, 4 * 6);
  c.Add(1, kDst, "w", v1::BF16, 4 * 6);
  float* src = c.Data<float>(0, kSrc, "w");
  FillFloats(src, 24, 1.5f);
  PlanBuilder pb;
  // Rows 0-1 whole; rows 2-3 columns 1..4 (strided on both sides).
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {2, 6}, v1::FP32), View("w", 0, {2, 6}, v1::BF16), v1::BF16),
                Piece(View("w", (2 * 6 + 1) * 4, {2, 3}, v1::FP32, {6, 1}),
                      View("w", (2 * 6 + 1) * 2, {2, 3}, v1::BF16, {6, 1}), v1::BF16)});
  ASSERT_TRUE(c.Connect().ok());
  auto results = c.Run(pb.Build(), absl::Seconds(30));
  ExpectAllOk(results);
  const uint16_t* dst = c.Data<uint16_t>(1, kDst, "w");
  for (int r = 0; r < 4; ++r) {
    for (int col = 0; col < 6; ++col) {
      const int i = r * 6 + col;
      const bool covered = r < 2 || (col >= 1 && col <= 3);
      if (covered) {
        EXPECT_EQ(dst[i], FloatToBf16(src[i])) << i;
      } else {
        EXPECT_TRUE(IsSentinel16(dst[i])) << "element " << i << " was written";
      }
    }
  }
  ASSERT_TRUE(results[0].ok());
  EXPECT_EQ(results[0]->bytes_sent, (12 + 6) * 2);
  EXPECT_EQ(results[1].value().bytes_received, (12 + 6) * 2);
}

// A colocated worker copies locally with a cast and a transpose-like stride.
TEST(ExecutorTest, LocalCopyWithCast) {
  Cluster c(1);
  c.Add(0, kSrc, "a", v1::FP32, 3 * 4);
  c.Add(0, kDst, "a", v1::FP16, 4 * 3);
  float* src = c.Data<float>(0, kSrc, "a");
  FillFloats(src, 12, -2.0f);
  PlanBuilder pb;
  // dst[j][i] = src[i][j]: src row-major [3,4]; dst viewed as [3,4] with strides {1,3}.
  pb.AddBucket(
      0, 0, 0,
      {Piece(View("a", 0, {3, 4}, v1::FP32), View("a", 0, {3, 4}, v1::FP16, {1, 3}), v1::FP32)});
  ASSERT_TRUE(c.Connect().ok());
  auto results = c.Run(pb.Build(), absl::Seconds(30));
  ExpectAllOk(results);
  const uint16_t* dst = c.Data<uint16_t>(0, kDst, "a");
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(dst[j * 3 + i], FloatToFp16(src[i * 4 + j])) << i << j;
  }
  EXPECT_EQ(results[0]->bytes_local, 12 * 4);
}

// Zero-copy buckets in both directions in one round, next to a staged one.
TEST(ExecutorTest, ZeroCopyBothDirections) {
  Cluster c(2);
  constexpr int64_t kN = 1 << 16;
  for (int w = 0; w < 2; ++w) {
    c.Add(w, kSrc, "x", v1::BF16, kN);
    c.Add(w, kDst, "x", v1::BF16, kN);
    uint16_t* s = c.Data<uint16_t>(w, kSrc, "x");
    for (int64_t i = 0; i < kN; ++i) s[i] = static_cast<uint16_t>(i * 7 + w);
  }
  PlanBuilder pb;
  const int64_t half = kN / 2;
  for (int w = 0; w < 2; ++w) {
    pb.AddBucket(w, 1 - w, 0,
                 {Piece(View("x", 0, {half}, v1::BF16), View("x", 0, {half}, v1::BF16), v1::BF16)},
                 /*zero_copy=*/true);
    pb.AddBucket(w, 1 - w, 0,
                 {Piece(View("x", half * 2, {half}, v1::BF16),
                        View("x", half * 2, {half}, v1::BF16), v1::BF16)});
  }
  const v1::Plan plan = pb.Build();
  for (const v1::RankPlan& rp : plan.ranks()) {
    EXPECT_EQ(rp.rounds(0).staging_bytes(), 2 * half * 2);  // only the staged ones
  }
  ASSERT_TRUE(c.Connect().ok());
  ExpectAllOk(c.Run(plan, absl::Seconds(30)));
  for (int w = 0; w < 2; ++w) {
    const uint16_t* d = c.Data<uint16_t>(w, kDst, "x");
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(d[i], static_cast<uint16_t>(i * 7 + (1 - w))) << "worker " << w << " elem " << i;
    }
  }
}

// Workers 0 and 1 send partial sums to worker 2, which adds its own local
// partial: fp32 accumulation in the reduce's input order, then cast to bf16.
TEST(ExecutorTest, ReduceOfPartials) {
  Cluster c(3);
  constexpr int64_t kN = 1000;
  for (int w = 0; w < 3; ++w) {
    c.Add(w, kSrc, "p", v1::FP32, kN);
    FillFloats(c.Data<float>(w, kSrc, "p"), kN, 10.0f * (w + 1));
  }
  c.Add(2, kDst, "p", v1::BF16, kN);
  PlanBuilder pb;
  const auto src = View("p", 0, {kN}, v1::FP32);
  const auto dst = View("p", 0, {kN}, v1::BF16);
  const int64_t b0 = pb.AddBucket(0, 2, 0, {Piece(src, dst, v1::FP32, /*reduce_id=*/1)});
  const int64_t b1 = pb.AddBucket(1, 2, 0, {Piece(src, dst, v1::FP32, 1)});
  const int64_t b2 = pb.AddBucket(2, 2, 0, {Piece(src, dst, v1::FP32, 1)});
  pb.AddReduce(2, 0, v1::REDUCE_AVG, v1::FP32, dst, {{b1, 0}, {b2, 0}, {b0, 0}});
  ASSERT_TRUE(c.Connect().ok());
  ExpectAllOk(c.Run(pb.Build(), absl::Seconds(30)));
  const uint16_t* out = c.Data<uint16_t>(2, kDst, "p");
  for (int64_t i = 0; i < kN; ++i) {
    float acc = c.Data<float>(1, kSrc, "p")[i];
    acc += c.Data<float>(2, kSrc, "p")[i];
    acc += c.Data<float>(0, kSrc, "p")[i];
    acc /= 3.0f;
    ASSERT_EQ(out[i], FloatToBf16(acc)) << i;
  }
}

// Worker 1 receives in round 0 and relays from its destination buffer to
// worker 2 in round 1.
TEST(ExecutorTest, RelayThroughDestination) {
  Cluster c(3);
  constexpr int64_t kN = 4096;
  c.Add(0, kSrc, "r", v1::FP32, kN);
  FillFloats(c.Data<float>(0, kSrc, "r"), kN, 3.0f);
  c.Add(1, kDst, "r", v1::BF16, kN);
  c.Add(2, kDst, "r", v1::BF16, kN);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("r", 0, {kN}, v1::FP32), View("r", 0, {kN}, v1::BF16), v1::BF16)});
  pb.AddBucket(1, 2, 1,
               {Piece(Dst(View("r", 0, {kN}, v1::BF16)), View("r", 0, {kN}, v1::BF16), v1::BF16)});
  ASSERT_TRUE(c.Connect().ok());
  ExpectAllOk(c.Run(pb.Build(), absl::Seconds(30)));
  const float* src = c.Data<float>(0, kSrc, "r");
  for (int w : {1, 2}) {
    const uint16_t* d = c.Data<uint16_t>(w, kDst, "r");
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(d[i], FloatToBf16(src[i])) << w << " " << i;
  }
}

// A tiny staging cap: one 4 KiB bucket per round, 4 workers all-to-all, 16
// rounds. Staging never exceeds what each round grants; the allocation is
// reused (one allocation of the peak).
TEST(ExecutorTest, TinyStagingCapManyRounds) {
  constexpr int kWorkers = 4;
  constexpr int64_t kChunk = 1024;  // fp32 elements per bucket = 4 KiB
  constexpr int kChunks = 16;
  Cluster c(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    c.Add(w, kSrc, "t", v1::FP32, kChunk * kChunks);
    FillFloats(c.Data<float>(w, kSrc, "t"), kChunk * kChunks, 100.0f * w);
    c.Add(w, kDst, "t", v1::FP32, kChunk * kChunks * kWorkers);
  }
  // Round k: worker w sends chunk k to worker (w + 1 + k % 3) % kWorkers.
  PlanBuilder pb;
  for (int k = 0; k < kChunks; ++k) {
    for (int w = 0; w < kWorkers; ++w) {
      const int to = (w + 1 + k % 3) % kWorkers;
      pb.AddBucket(
          w, to, k,
          {Piece(View("t", k * kChunk * 4, {kChunk}, v1::FP32),
                 View("t", (w * kChunks + k) * kChunk * 4, {kChunk}, v1::FP32), v1::FP32)});
    }
  }
  const v1::Plan plan = pb.Build();
  int64_t peak = 0;
  for (const v1::RankPlan& rp : plan.ranks()) {
    for (const v1::Round& r : rp.rounds()) peak = std::max(peak, r.staging_bytes());
  }
  EXPECT_EQ(peak, 2 * kChunk * 4);
  ASSERT_TRUE(c.Connect().ok());
  std::atomic<int> callbacks{0};
  auto results = c.Run(plan, absl::Seconds(60), {}, [&](const Progress& p) {
    ++callbacks;
    EXPECT_LE(p.bytes_done, p.bytes_total);
    EXPECT_EQ(p.rounds_total, kChunks);
  });
  ExpectAllOk(results);
  EXPECT_EQ(callbacks.load(), kWorkers * kChunks);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(results[w].ok());
    EXPECT_EQ(results[w]->rounds.size(), static_cast<size_t>(kChunks));
    for (const RoundStats& rs : results[w]->rounds) {
      const v1::Round* granted = nullptr;
      for (const v1::RankPlan& rp : plan.ranks()) {
        for (const v1::Round& r : rp.rounds()) {
          if (rp.worker() == w && r.index() == rs.index) granted = &r;
        }
      }
      ASSERT_NE(granted, nullptr);
      EXPECT_LE(rs.staging_bytes, granted->staging_bytes())
          << "worker " << w << " round " << rs.index;
    }
    // The pipelined executor (default) holds two rounds' staging sets: round
    // r+1 is packed while round r transfers; each set is 256-byte aligned.
    EXPECT_LE(c.executor(w).allocated_staging_bytes(), 2 * peak + 255);
    EXPECT_EQ(c.executor(w).current_staging_bytes(), 0);
  }
  for (int k = 0; k < kChunks; ++k) {
    for (int w = 0; w < kWorkers; ++w) {
      const int to = (w + 1 + k % 3) % kWorkers;
      const float* s = c.Data<float>(w, kSrc, "t") + k * kChunk;
      const float* d = c.Data<float>(to, kDst, "t") + (w * kChunks + k) * kChunk;
      ASSERT_EQ(std::memcmp(s, d, kChunk * 4), 0) << "chunk " << k << " from " << w;
    }
  }
}

// The same bound plan replays: a second sync moves the new values.
TEST(ExecutorTest, ReplaysForNewVersions) {
  Cluster c(2);
  constexpr int64_t kN = 777;
  c.Add(0, kSrc, "v", v1::FP32, kN);
  c.Add(1, kDst, "v", v1::FP8_E4M3, kN);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("v", 0, {kN}, v1::FP32), View("v", 0, {kN}, v1::FP8_E4M3), v1::BF16)});
  const v1::Plan plan = pb.Build();
  ASSERT_TRUE(c.Connect().ok());
  for (int version = 0; version < 3; ++version) {
    FillFloats(c.Data<float>(0, kSrc, "v"), kN, version * 50.0f);
    ExpectAllOk(c.Run(plan, absl::Seconds(30)));
    const float* s = c.Data<float>(0, kSrc, "v");
    const uint8_t* d = c.Data<uint8_t>(1, kDst, "v");
    for (int64_t i = 0; i < kN; ++i) {
      // bf16 on the wire, then fp8 at the receiver: two roundings, as planned.
      ASSERT_EQ(d[i], FloatToFp8E4M3(Bf16ToFloat(FloatToBf16(s[i])))) << version << " " << i;
    }
  }
}

// A peer that never runs its part: DEADLINE_EXCEEDED naming round, buckets
// and peer, within the round timeout.
TEST(ExecutorTest, SilentPeerHitsRoundDeadline) {
  Cluster c(2);
  const v1::Plan plan = OneFloatBucket(c, 1, 256);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(1);
  ASSERT_TRUE(c.Connect(o).ok());
  const absl::Time start = absl::Now();
  auto results = c.Run(plan, absl::Seconds(60), /*silent=*/{1});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(results[0].ok());
  const absl::Status& s = results[0].status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("round 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("peer 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("send buckets 0"), std::string::npos) << s;
}

// Abort from another thread ends a sync stuck on a silent peer.
TEST(ExecutorTest, AbortEndsSyncPromptly) {
  Cluster c(2);
  const v1::Plan plan = OneFloatBucket(c, 1, 256);
  ASSERT_TRUE(c.Connect().ok());
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    c.executor(0).Abort("operator cancelled sync");
  });
  auto results = c.Run(plan, absl::Seconds(60), /*silent=*/{1});
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kCancelled) << results[0].status();
  EXPECT_NE(results[0].status().message().find("operator cancelled sync"), std::string::npos)
      << results[0].status();
}

TEST(ExecutorTest, RefusesPlanBoundAgainstOldRegistry) {
  Cluster c(1);
  const v1::Plan plan = OneFloatBucket(c, 0, 4);
  ASSERT_TRUE(c.Connect().ok());
  auto bound = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost);
  ASSERT_TRUE(bound.ok()) << bound.status();
  c.Add(0, kDst, "b", v1::FP32, 4);
  auto r = c.executor(0).Run(**bound, c.registry(0).generation(), absl::Now() + absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
}

}  // namespace
}  // namespace wsync::exec::testing
