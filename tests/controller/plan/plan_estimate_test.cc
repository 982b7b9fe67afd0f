// MinPiecesFromSpec: exact counts for the closed forms, lower bounds for the
// rest (checked against real plans), and the planner refusing a spec over
// --max_plan_pieces before it compiles the sides.
#include "controller/plan/plan_estimate.h"

#include <chrono>
#include <limits>

#include "controller/plan/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT
using ::testing::HasSubstr;

// `tensors` tensors of [rows, cols], FSDP over `ranks` (Shard(0)) into one
// replicated destination rank.
v1::TransferSpec Fsdp(int tensors, int32_t ranks, int64_t rows, int64_t cols) {
  v1::Side src = Side("train", Range(0, ranks));
  v1::Side dst = Side("infer", {ranks});
  for (int i = 0; i < tensors; ++i) {
    const std::string name = "w" + std::to_string(i);
    Mesh(&src, name, {rows, cols}, {ranks}, {Sh(0)});
    Mesh(&dst, name, {rows, cols}, {1}, {Rep()});
  }
  return Spec(std::move(src), std::move(dst));
}

TEST(PlanEstimateTest, FsdpCountsEveryShardOfEveryTensor) {
  EXPECT_EQ(MinPiecesFromSpec(Fsdp(3, 8, 64, 4)), 3 * 8);
  // torch.chunk: 5 rows over 4 ranks is chunks of 2, 2, 1 and an empty one.
  EXPECT_EQ(MinPiecesFromSpec(Fsdp(1, 4, 5, 4)), 3);
  // More ranks than rows: one shard per row.
  EXPECT_EQ(MinPiecesFromSpec(Fsdp(1, 8, 3, 4)), 3);
}

TEST(PlanEstimateTest, ReplicasOfAShardCountOnce) {
  v1::Side src = Side("train", Range(0, 8));
  Mesh(&src, "w", {16, 4}, {2, 4}, {Rep(), Sh(0)});  // HSDP: 2 replicas of 4 shards
  Mesh(&src, "u", {16, 8}, {2, 4}, {Sh(1), Sh(0)});  // 2 x 4 distinct shards
  v1::Side dst = Side("infer", {8});
  Mesh(&dst, "w", {16, 4}, {1}, {Rep()});
  Mesh(&dst, "u", {16, 8}, {1}, {Rep()});
  EXPECT_EQ(MinPiecesFromSpec(Spec(std::move(src), std::move(dst))), 4 + 8);
}

TEST(PlanEstimateTest, MappedRegionsCountTheShardsTheyMeet) {
  v1::Side src = Side("train", Range(0, 4));
  Mesh(&src, "w", {8, 4}, {4}, {Sh(0)});  // rows 0-1, 2-3, 4-5, 6-7
  v1::Side dst = Side("infer", {4});
  Mesh(&dst, "a", {4, 4}, {1}, {Rep()});
  Mesh(&dst, "b", {1, 4}, {1}, {Rep()});
  v1::TransferSpec spec = Spec(std::move(src), std::move(dst));
  Map(&spec, "a", {0, 0}, "w", {3, 0}, {4, 4});  // rows 3-6: three shards
  Map(&spec, "b", {0, 0}, "w", {0, 0}, {1, 4});  // row 0: one shard
  EXPECT_EQ(MinPiecesFromSpec(spec), 3 + 1);
}

TEST(PlanEstimateTest, ExplicitDestinationsCountWhatOneFragmentHolds) {
  v1::Side src = Side("train", Range(0, 4));
  Mesh(&src, "w", {8, 4}, {4}, {Sh(0)});
  v1::Side dst = Side("infer", {4, 5});
  v1::TensorLayout* t = Explicit(&dst, "w", {8, 4});
  Frag(t, 0, {0, 0}, {3, 4}, "w");  // rows 0-2: two shards
  Frag(t, 1, {4, 0}, {2, 4}, "w");  // rows 4-5: one shard; rows 3, 6, 7 unheld
  EXPECT_EQ(MinPiecesFromSpec(Spec(std::move(src), std::move(dst))), 2);
}

TEST(PlanEstimateTest, OtherLayoutsCountOnePerRegion) {
  v1::Side src = Side("train", Range(0, 4));
  Mesh(&src, "strided", {8, 4}, {4}, {Strided(0, 2)});
  Mesh(&src, "partial", {8, 4}, {4}, {Part()});
  Mesh(&src, "nested", {8, 4}, {2, 2}, {Sh(0), Sh(0)});
  v1::TensorLayout* e = Explicit(&src, "explicit", {8, 4});
  for (int r = 0; r < 4; ++r) Frag(e, r, {2 * r, 0}, {2, 4}, "e");
  v1::Side dst = Side("infer", {4});
  for (const char* n : {"strided", "partial", "nested", "explicit"}) {
    Mesh(&dst, n, {8, 4}, {1}, {Rep()});
  }
  EXPECT_EQ(MinPiecesFromSpec(Spec(std::move(src), std::move(dst))), 4);
}

TEST(PlanEstimateTest, MalformedInputCountsNothingAndNeverOverflows) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  v1::Side src = Side("train", Range(0, 2));
  Mesh(&src, "w", {big, big}, {2}, {Sh(0)});
  Mesh(&src, "bad_dim", {8}, {2}, {Sh(5)});
  Mesh(&src, "neg", {-4}, {2}, {Sh(0)});
  v1::TensorLayout* short_mesh = Mesh(&src, "short", {8}, {2}, {Sh(0)});
  short_mesh->mutable_mesh()->mutable_ranks()->RemoveLast();  // 2 coordinates, 1 rank
  v1::Side dst = Side("infer", {2});
  Mesh(&dst, "a", {big, big}, {1}, {Rep()});
  Mesh(&dst, "b", {8}, {1}, {Rep()});
  Mesh(&dst, "neg", {4}, {1}, {Rep()});
  Mesh(&dst, "bad_dim", {8}, {1}, {Rep()});
  Mesh(&dst, "short", {8}, {1}, {Rep()});
  v1::TransferSpec spec = Spec(std::move(src), std::move(dst));
  Map(&spec, "a", {0, 0}, "w", {big - 1, 0}, {big, big});  // off + len overflows
  Map(&spec, "a", {-3, 0}, "w", {0, 0}, {1, 1});           // negative destination
  Map(&spec, "b", {0}, "w", {0, 0}, {-1, 4});              // negative length
  Map(&spec, "b", {0}, "w", {0}, {1});                     // rank of neither
  Map(&spec, "b", {0}, "missing", {0}, {8});
  const int64_t n = MinPiecesFromSpec(spec);
  // Only "a"'s first entry is well formed: row big-1 is one shard; bad_dim
  // and short are outside the closed form (one each); neg counts nothing.
  EXPECT_EQ(n, 1 + 1 + 1);
}

// Fragments x regions of explicit destinations is quadratic in the spec:
// past kMinPiecesWorkBudget pairs a tensor counts nothing instead.
TEST(PlanEstimateTest, QuadraticWorkIsBudgeted) {
  const int n = 9000;  // 81 M pairs > 64 Mi
  v1::Side src = Side("train", Range(0, 2));
  Mesh(&src, "w", {n, 2}, {2}, {Sh(1)});
  v1::Side dst = Side("infer", {2});
  v1::TensorLayout* big = Explicit(&dst, "big", {n, 2});
  v1::TensorLayout* small = Explicit(&dst, "small", {n, 2});
  for (int i = 0; i < n; ++i) Frag(big, 0, {i, 0}, {1, 2}, "big");
  Frag(small, 0, {0, 0}, {n, 2}, "small");
  v1::TransferSpec spec = Spec(std::move(src), std::move(dst));
  for (int i = 0; i < n; ++i) Map(&spec, "big", {i, 0}, "w", {i, 0}, {1, 2});
  Map(&spec, "small", {0, 0}, "w", {0, 0}, {n, 2});
  const auto start = std::chrono::steady_clock::now();
  // "big" (81 M pairs) is skipped; "small" (one pair) meets both shards.
  EXPECT_EQ(MinPiecesFromSpec(spec), 2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

// Regression: a spec of many source shards used to be compiled (every
// fragment), mapped into cells and only then refused: Kimi-K2 from FSDP2 over
// 256 ranks took 3 GiB before the cells and exhausted a 24 GiB machine. Now
// the count from the spec refuses it first (checked to fail before the
// change: the message named cells, after compiling 4 M fragments).
TEST(PlanEstimateTest, PlannerRefusesBeforeCompiling) {
  const v1::TransferSpec spec = Fsdp(1024, 4096, 4096, 1);  // 4 M shards
  BuildOptions build;
  build.max_pieces = 1'000'000;
  build.stacking = BuildOptions::Stacking::kOff;
  const auto start = std::chrono::steady_clock::now();
  v1::Plan plan;
  const absl::Status st = BuildPlanInto(spec, &plan, build);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(std::string(st.message()),
              ::testing::AllOf(HasSubstr("4194304 pieces"), HasSubstr("counted from the spec"),
                               HasSubstr("limit of 1000000"), HasSubstr("--max_plan_pieces"),
                               HasSubstr("--max-pieces")));
  EXPECT_LT(seconds, 30.0);  // generous: well under a second on an idle core
  // Without a limit the estimate is not computed and the same spec plans
  // (scaled down here to keep the test small).
  EXPECT_TRUE(BuildPlan(Fsdp(2, 64, 64, 1)).ok());
}

// With stacking (the default, kAuto), the same spec's 1024 alike tensors are
// planned as one stacked tensor, within the limit in records; a spec over
// the limit whose tensors are all different is refused as unstacked.
TEST(PlanEstimateTest, StackingPlansAlikeTensorsTheLimitRefusesUnstacked) {
  BuildOptions build;
  build.max_pieces = 1'000'000;
  build.record_plan_seconds = false;
  absl::StatusOr<v1::Plan> plan = BuildPlan(Fsdp(1024, 4096, 4096, 1), build);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->summary().num_pieces(), 4096 * 1024);
  int64_t records = 0;
  for (const v1::Bucket& b : plan->buckets()) records += b.pieces_size() + b.runs_size();
  EXPECT_LE(records, build.max_pieces);

  v1::Side src = Side("train", Range(0, 64));
  v1::Side dst = Side("infer", {64});
  for (int i = 0; i < 8; ++i) {  // 8 tensors of different shapes: nothing stacks
    const std::string name = "w" + std::to_string(i);
    Mesh(&src, name, {64 + i, 2}, {64}, {Sh(0)});
    Mesh(&dst, name, {64 + i, 2}, {1}, {Rep()});
  }
  build.max_pieces = 100;
  const absl::Status st = BuildPlan(Spec(std::move(src), std::move(dst)), build).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("counted from the spec"));
}

}  // namespace
}  // namespace wsync::plan
