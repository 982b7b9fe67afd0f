// End-to-end planner tests: every plan is replayed on element-id data and
// every destination element is checked (BuildAndVerify).
#include "controller/plan/planner.h"

#include <algorithm>
#include <map>

#include "controller/plan/rank_parts.h"
#include "controller/verify/replay.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

TEST(PlannerTest, FsdpToTensorParallelDisjoint) {
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(10, 2));
  Mesh(&src, "w", {8, 6}, {4}, {Sh(0)});
  Mesh(&dst, "w", {8, 6}, {2}, {Sh(1)});
  Mesh(&src, "b", {6}, {4}, {Sh(0)});
  Mesh(&dst, "b", {6}, {2}, {Rep()});
  v1::Plan plan = BuildAndVerify(Spec(src, dst));
  EXPECT_GT(plan.buckets_size(), 0);
  EXPECT_EQ(plan.summary().local_bytes(), 0);
  EXPECT_EQ(plan.summary().destination_bytes(), (8 * 6 + 6 * 2) * 4);
}

TEST(PlannerTest, ColocatedSelfCopiesBundledWithNetworkPieces) {
  // Workers 0..3 train; workers 0..1 also serve: their own shard is a local
  // copy, the rest comes over the network.
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(0, 2));
  Mesh(&src, "w", {8, 4}, {4}, {Sh(0)});
  Mesh(&dst, "w", {8, 4}, {2}, {Sh(0)});
  Mesh(&src, "v", {8}, {4}, {Sh(0)});
  Mesh(&dst, "v", {8}, {2}, {Rep()});
  v1::Plan plan = BuildAndVerify(Spec(src, dst));
  int local = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.transport() == v1::TRANSPORT_LOCAL) {
      ++local;
      EXPECT_EQ(b.sender(), b.receiver());
      // Worker 0 holds rows 0:2 of both tensors: two self pieces, one bucket.
      if (b.sender() == 0) EXPECT_EQ(b.pieces_size(), 2) << b.DebugString();
    }
  }
  EXPECT_EQ(local, 2);
  EXPECT_GT(plan.summary().local_bytes(), 0);
}

TEST(PlannerTest, CastsHappenOnTheNarrowSide) {
  v1::Side src = Side("trainer", Range(0, 2));
  v1::Side dst = Side("infer", Range(5, 2));
  Mesh(&src, "down", {4, 4}, {2}, {Sh(0)}, v1::FP32);
  Mesh(&dst, "down", {4, 4}, {2}, {Sh(1)}, v1::BF16);
  Mesh(&src, "up", {4, 4}, {2}, {Sh(0)}, v1::BF16);
  Mesh(&dst, "up", {4, 4}, {2}, {Sh(1)}, v1::FP32);
  Mesh(&src, "h2b", {4, 4}, {2}, {Sh(0)}, v1::FP16);
  Mesh(&dst, "h2b", {4, 4}, {2}, {Rep()}, v1::BF16);
  Mesh(&src, "b2h", {4, 4}, {2}, {Sh(0)}, v1::BF16);
  Mesh(&dst, "b2h", {4, 4}, {2}, {Rep()}, v1::FP16);
  v1::TransferSpec spec = Spec(src, dst);
  AllowCast(&spec, v1::FP32, v1::BF16);
  AllowCast(&spec, v1::BF16, v1::FP32);
  AllowCast(&spec, v1::FP16, v1::BF16);
  AllowCast(&spec, v1::BF16, v1::FP16);
  v1::Plan plan = BuildAndVerify(spec);
  ForEachPlanPiece(plan, [&](const v1::Bucket&, const v1::Piece& p) {
    const std::string& tensor = plan.names(p.tensor_name());
    if (tensor == "down" || tensor == "up") EXPECT_EQ(p.wire_dtype(), v1::BF16);
    if (tensor == "h2b") EXPECT_EQ(p.wire_dtype(), v1::BF16);
    if (tensor == "b2h") EXPECT_EQ(p.wire_dtype(), v1::FP16);
  });
}

TEST(PlannerTest, DeterministicAndKeyed) {
  v1::Side src = Side("trainer", Range(0, 8), 4);
  v1::Side dst = Side("infer", Range(8, 4), 4);
  Mesh(&src, "a", {16, 12}, {2, 4}, {Rep(), Sh(0)});
  Mesh(&dst, "a", {16, 12}, {4}, {Sh(1)});
  Mesh(&src, "b", {9, 5}, {8}, {Sh(0)});
  Mesh(&dst, "b", {9, 5}, {4}, {Sh(0)});
  v1::TransferSpec spec = Spec(src, dst);
  BuildOptions o;
  o.record_plan_seconds = false;
  absl::StatusOr<v1::Plan> a = BuildPlan(spec, o);
  absl::StatusOr<v1::Plan> b = BuildPlan(spec, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  EXPECT_EQ(a->key(), PlanKey(spec));
  EXPECT_EQ(a->key().size(), 16u);
  v1::TransferSpec other = spec;
  other.mutable_options()->set_bucket_bytes(1024);
  EXPECT_NE(PlanKey(other), PlanKey(spec));
  other = spec;
  other.set_name("renamed");
  EXPECT_EQ(PlanKey(other), PlanKey(spec));
}

TEST(PlannerTest, SummaryOnlyMatchesFull) {
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(4, 4));
  Mesh(&src, "a", {16, 12}, {4}, {Sh(0)});
  Mesh(&dst, "a", {16, 12}, {2, 2}, {Rep(), Sh(1)});
  v1::TransferSpec spec = Spec(src, dst);
  BuildOptions o;
  o.record_plan_seconds = false;
  absl::StatusOr<v1::Plan> full = BuildPlan(spec, o);
  o.summary_only = true;
  absl::StatusOr<v1::Plan> sum = BuildPlan(spec, o);
  ASSERT_TRUE(full.ok() && sum.ok());
  EXPECT_EQ(sum->buckets_size(), 0);
  EXPECT_EQ(sum->summary().SerializeAsString(), full->summary().SerializeAsString());
}

TEST(PlannerTest, ExtractRankPlanKeepsOnlyItsPart) {
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(4, 2));
  Mesh(&src, "a", {8, 8}, {4}, {Sh(0)});
  Mesh(&dst, "a", {8, 8}, {2}, {Sh(1)});
  v1::Plan plan = BuildAndVerify(Spec(src, dst));
  absl::StatusOr<v1::Plan> part = ExtractRankPlan(plan, 4);
  ASSERT_TRUE(part.ok());
  ASSERT_EQ(part->ranks_size(), 1);
  EXPECT_EQ(part->ranks(0).worker(), 4);
  for (const v1::Bucket& b : part->buckets()) EXPECT_TRUE(b.sender() == 4 || b.receiver() == 4);
  int64_t ops = 0;
  for (const v1::Round& r : part->ranks(0).rounds()) ops += r.ops_size();
  EXPECT_EQ(ops, part->buckets_size());
  EXPECT_FALSE(ExtractRankPlan(plan, 99).ok());
}

// The controller splits a plan for all its workers in one pass: every part
// is exactly what ExtractRankPlan gives (partial sums, relays to replicas,
// colocated copies included).
TEST(PlannerTest, SplitRankPlansEqualsExtractRankPlanForEveryWorker) {
  v1::Side src = Side("trainer", Range(0, 4), 2);
  v1::Side dst = Side("infer", Range(2, 4), 2);  // workers 2, 3 in both groups
  Mesh(&src, "a", {8, 8}, {2, 2}, {Part(), Sh(0)});
  Mesh(&dst, "a", {8, 8}, {4}, {Rep()});
  Mesh(&src, "b", {8, 16}, {4}, {Sh(0)});
  Mesh(&dst, "b", {8, 16}, {4}, {Sh(1)});
  v1::Plan plan = BuildAndVerify(Spec(src, dst));
  ASSERT_GT(plan.reduces_size(), 0);
  const std::vector<RankPart> parts = SplitRankPlans(plan);
  ASSERT_EQ(parts.size(), static_cast<size_t>(plan.ranks_size()));
  for (const RankPart& part : parts) {
    absl::StatusOr<v1::Plan> want = ExtractRankPlan(plan, part.worker);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(part.plan->SerializeAsString(), want->SerializeAsString())
        << "worker " << part.worker;
  }
}

}  // namespace
}  // namespace wsync::plan
