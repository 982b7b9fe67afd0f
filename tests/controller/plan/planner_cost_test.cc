// The planner's summary costs agree with the simulator (same link model),
// and the plan-level cost helper agrees with both.
#include <cmath>
#include <map>
#include <string>

#include "controller/plan/plan_cost.h"
#include "controller/plan/planner.h"
#include "controller/plan/simulator.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

// The pipeline's round count minimizes T + d T / R' + (R' + d) L over
// R' = R - d rounds of data: d + sqrt(d T / L); nothing to pipeline without
// relays, latency or data.
TEST(PlannerCostTest, PipelineRoundCountMinimizesTheRelaysTailPlusLatency) {
  EXPECT_DOUBLE_EQ(PipelineRoundCount(2, 40e-3, 50e-6), 42.0);
  EXPECT_DOUBLE_EQ(PipelineRoundCount(1, 0.25, 1e-3), 1 + std::sqrt(250.0));
  const double t = 40e-3, l = 50e-6;
  auto cost = [&](double r) { return t + 2 * t / (r - 2) + r * l; };
  const double best = PipelineRoundCount(2, t, l);
  EXPECT_LT(cost(best), cost(best - 5));
  EXPECT_LT(cost(best), cost(best + 5));
  EXPECT_EQ(PipelineRoundCount(0, t, l), 0);
  EXPECT_EQ(PipelineRoundCount(2, t, 0), 0);
  EXPECT_EQ(PipelineRoundCount(2, 0, l), 0);
  EXPECT_EQ(PipelineRoundCount(2, t, std::nan("")), 0);
}

TEST(PlannerCostTest, SummaryMatchesSimulator) {
  v1::Side src = Side("trainer", Range(0, 8), 4);
  v1::Side dst = Side("infer", Range(4, 8), 4);  // partly colocated, two nodes each
  for (int t = 0; t < 6; ++t) {
    const std::string n = "t" + std::to_string(t);
    Mesh(&src, n, {64, 48}, {2, 4}, {Rep(), Sh(0)});
    Mesh(&dst, n, {64, 48}, {2, 4}, {Rep(), Sh(1)});
  }
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(4096);
  spec.mutable_options()->set_staging_cap_bytes(16384);
  spec.mutable_options()->mutable_link_model()->set_round_latency_seconds(1e-6);
  v1::Plan plan = BuildAndVerify(spec);
  absl::StatusOr<WorkerNodes> nodes = WorkerNodesFromSpec(spec);
  ASSERT_TRUE(nodes.ok());
  absl::StatusOr<SimulationResult> sim = SimulatePlan(plan, *nodes, spec.options().link_model());
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_NEAR(plan.summary().predicted_seconds(), sim->makespan_seconds, 1e-12);
  EXPECT_NEAR(plan.summary().lower_bound_seconds(), sim->lower_bound_seconds, 1e-12);
  absl::StatusOr<CostReport> cost = EvaluatePlanCost(plan, EffectiveLinkModel(spec.options()));
  ASSERT_TRUE(cost.ok());
  EXPECT_NEAR(cost->predicted_seconds, sim->makespan_seconds, 1e-12);
  EXPECT_NEAR(cost->lower_bound_seconds, sim->lower_bound_seconds, 1e-12);
  EXPECT_GT(plan.num_rounds(), 1);
}

// Replicated tensors fanned out to two inference nodes: in each node one
// member takes a tensor over the network and relays it over NVLink, and which
// member does so rotates with NIC load, so every NIC of a node carries its
// share (it used to be the node's first rank for every tensor).
TEST(PlannerCostTest, ReplicatedTensorsSpreadOverEveryNicOfANode) {
  v1::Side src = Side("trainer", Range(0, 4), 4);  // node n0
  v1::Side dst = Side("infer", Range(4, 8), 4);    // nodes n1, n2
  for (int t = 0; t < 32; ++t) {
    const std::string n = "t" + std::to_string(t);
    Mesh(&src, n, {64, 64}, {4}, {Sh(0)});
    Mesh(&dst, n, {64, 64}, {8}, {Rep()});
  }
  v1::Plan plan = BuildAndVerify(Spec(src, dst));
  std::map<int32_t, std::string> node;
  for (const v1::WorkerInfo& w : plan.workers()) node[w.worker()] = w.node();
  std::map<int32_t, int64_t> nic_in;
  for (const v1::Bucket& b : plan.buckets()) {
    if (node[b.sender()] != node[b.receiver()]) nic_in[b.receiver()] += b.bytes();
  }
  // Each node needs 32 x 16 KiB of distinct bytes: 128 KiB per NIC at balance.
  const int64_t balanced = 32 * 64 * 64 * 4 / 4;
  for (int32_t w = 4; w < 12; ++w) {
    EXPECT_GT(nic_in[w], 0) << "worker " << w << " takes nothing over its NIC";
    EXPECT_LE(nic_in[w], balanced * 5 / 4) << "worker " << w;
  }
}

}  // namespace
}  // namespace wsync::plan
