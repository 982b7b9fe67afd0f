// Executor::WarmUp (docs/warm-up.md): staging and one message per peer
// before the first sync, which then runs over the same transport.
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/plan_builder.h"
#include "worker/exec/executor.h"

namespace wsync::exec::testing {
namespace {

// Three workers; worker 0 sends fp32 "s" to worker 1 (cast to bf16 on the
// wire: a staged bucket); worker 2 takes no part in it.
v1::Plan ZeroToOne(Cluster& c, int64_t n) {
  c.Add(0, BufferSide::kSource, "s", v1::FP32, n);
  c.Add(1, BufferSide::kDestination, "s", v1::FP32, n);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("s", 0, {n}, v1::FP32), View("s", 0, {n}, v1::FP32), v1::BF16)});
  return pb.Build();
}

// Binds `plan` for every worker and warms up those not in `silent`.
std::vector<absl::StatusOr<int32_t>> WarmUpAll(Cluster& c, const v1::Plan& plan, int n,
                                               absl::Duration timeout,
                                               const std::set<int>& silent = {}) {
  std::vector<absl::StatusOr<int32_t>> out(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    if (silent.count(w) != 0) continue;
    threads.emplace_back([&, w] {
      auto bound = BindPlan(plan, w, c.registry(w), MemorySpace::kHost, nullptr);
      if (!bound.ok()) {
        out[w] = bound.status();
        return;
      }
      out[w] = c.executor(w).WarmUp(**bound, c.registry(w).generation(), absl::Now() + timeout);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ExecutorWarmUpTest, GreetsEveryPeerAllocatesStagingAndTheSyncRunsAfter) {
  Cluster c(3);
  constexpr int64_t kN = 1000;
  const v1::Plan plan = ZeroToOne(c, kN);
  ASSERT_TRUE(c.Connect().ok());
  auto warm = WarmUpAll(c, plan, 3, absl::Seconds(30));
  for (int w = 0; w < 3; ++w)
    ASSERT_TRUE(warm[w].ok()) << "worker " << w << ": " << warm[w].status();
  EXPECT_EQ(*warm[0], 1);
  EXPECT_EQ(*warm[1], 1);
  EXPECT_EQ(*warm[2], 0) << "no peer in the plan: nothing sent";
  EXPECT_GE(c.executor(0).allocated_staging_bytes(), kN * 2) << "the bf16 wire bucket";
  EXPECT_GE(c.executor(1).allocated_staging_bytes(), kN * 2);
  const int64_t staged = c.executor(0).allocated_staging_bytes();
  float* src = c.Data<float>(0, BufferSide::kSource, "s");
  // Small integers: exact in bf16, the wire dtype.
  for (int64_t i = 0; i < kN; ++i) src[i] = static_cast<float>(i % 200);
  // The warm-up's messages are consumed: the sync's own match its bucket.
  auto results = c.Run(plan, absl::Seconds(30));
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(results[w].ok()) << results[w].status();
  EXPECT_EQ(c.executor(0).allocated_staging_bytes(), staged) << "reused, not reallocated";
  const float* dst = c.Data<float>(1, BufferSide::kDestination, "s");
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(dst[i], static_cast<float>(i % 200)) << i;
}

TEST(ExecutorWarmUpTest, APeerThatNeverWarmsUpFailsItNamingThePeer) {
  Cluster c(2);
  const v1::Plan plan = ZeroToOne(c, 64);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(1);
  ASSERT_TRUE(c.Connect(o).ok());
  const absl::Time start = absl::Now();
  auto warm = WarmUpAll(c, plan, 2, absl::Seconds(60), /*silent=*/{1});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(warm[0].ok());
  EXPECT_EQ(warm[0].status().code(), absl::StatusCode::kDeadlineExceeded) << warm[0].status();
  EXPECT_NE(warm[0].status().message().find("warm-up messages with workers 1"), std::string::npos)
      << warm[0].status();
}

}  // namespace
}  // namespace wsync::exec::testing
