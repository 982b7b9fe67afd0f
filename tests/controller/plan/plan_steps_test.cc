// Steps inside a round (plan_steps.cc, plan.proto Bucket.step): where the
// link model prices a step below a round barrier, the rounds of a fan-out
// pipeline become the steps of one round, the replay oracle runs them as a
// worker does, and the simulator and the routing bound price them.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "catalog/case.h"
#include "common/bucket_steps.h"
#include "controller/plan/plan_cost.h"
#include "controller/plan/planner.h"
#include "controller/plan/simulator.h"
#include "controller/verify/replay.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

constexpr double kNic = 50e9;

// One bf16 tensor [rows, cols] on trainer 0, replicated on n inference
// ranks (100..), every worker on a node of its own.
v1::TransferSpec FanSpec(int n, int64_t rows, int64_t cols, double round_latency,
                         double step_latency) {
  v1::TransferSpec spec = ReplicatedTensorSpec(1, n, rows, cols);
  v1::LinkModel* lm = spec.mutable_options()->mutable_link_model();
  lm->set_nic_bytes_per_second(kNic);
  lm->set_round_latency_seconds(round_latency);
  lm->set_step_latency_seconds(step_latency);
  return spec;
}

absl::StatusOr<SimulationResult> Simulate(const v1::TransferSpec& spec, const v1::Plan& plan) {
  absl::StatusOr<WorkerNodes> nodes = WorkerNodesFromSpec(spec);
  if (!nodes.ok()) return nodes.status();
  return SimulatePlan(plan, *nodes, spec.options().link_model());
}

int32_t MaxStep(const v1::Plan& plan) {
  int32_t s = 0;
  for (const v1::Bucket& b : plan.buckets()) s = std::max(s, b.step());
  return s;
}

// 32 MiB to 16 replicas at 50 GB/s (T = 671 us) with a round latency of
// 50 us and a step latency of 10 us, scaled down 4 x (8 MiB, 12.5 / 2.5 us):
// with barriers the pipeline's floor is 1.41 x the bound 2 L + T
// (RoundsTest.MidSizeFanOutNearTheBarrierPipelineFloor); with steps the
// chunks move as the steps of one round, and the plan lands below that
// floor, within 1.25 x the bound with steps, L + l + T.
TEST(StepsTest, MidSizeFanOutRelaysWithinOneRound) {
  constexpr double kRound = 12.5e-6, kStep = 2.5e-6;
  const v1::TransferSpec spec = FanSpec(16, 1024, 4096, kRound, kStep);
  const v1::Plan plan = BuildAndVerify(spec);
  EXPECT_TRUE(HasBucketSteps(plan));
  const double t = 8.0 * (1 << 20) / kNic;
  EXPECT_NEAR(plan.summary().routing_bound_seconds(), kRound + kStep + t, 1e-9)
      << plan.summary().routing_bound_term();
  absl::StatusOr<SimulationResult> sim = Simulate(spec, plan);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_NEAR(sim->makespan_seconds, plan.summary().predicted_seconds(), 1e-12);
  double barrier_floor = INFINITY;
  for (int r = 2; r < 64; ++r)
    barrier_floor = std::min(barrier_floor, r * kRound + t * r / (r - 1));
  EXPECT_LT(sim->makespan_seconds, 0.9 * barrier_floor);
  EXPECT_LE(sim->makespan_seconds, 1.25 * plan.summary().routing_bound_seconds())
      << plan.summary().num_rounds() << " rounds, up to " << MaxStep(plan) + 1 << " steps";
}

// Without a step latency (unknown) or with one no cheaper than a round, the
// planner makes no steps, and the bound keeps two rounds.
TEST(StepsTest, NoStepsWithoutACheaperStep) {
  for (double step : {0.0, 12.5e-6, 20e-6}) {
    const v1::TransferSpec spec = FanSpec(16, 1024, 4096, 12.5e-6, step);
    const v1::Plan plan = BuildAndVerify(spec);
    EXPECT_FALSE(HasBucketSteps(plan)) << "step latency " << step;
    EXPECT_NEAR(plan.summary().routing_bound_seconds(), 25e-6 + 8.0 * (1 << 20) / kNic, 1e-9);
  }
}

// Cast bytes never relay zero-copy, so never within a round: a fan-out
// that casts keeps round barriers, and its bound two rounds.
TEST(StepsTest, ACastFanOutKeepsRoundBarriers) {
  v1::TransferSpec spec = FanSpec(8, 1024, 4096, 12.5e-6, 2.5e-6);
  spec.mutable_destination()->mutable_tensors(0)->set_dtype(v1::FP32);
  v1::Cast* cast = spec.mutable_options()->add_allowed_casts();
  cast->set_from(v1::BF16);
  cast->set_to(v1::FP32);
  const v1::Plan plan = BuildAndVerify(spec);
  EXPECT_FALSE(HasBucketSteps(plan));
  EXPECT_NE(plan.summary().routing_bound_term().find("two rounds or more"), std::string::npos)
      << plan.summary().routing_bound_term();
}

// The oracle runs a round's steps in order: the same plan with every relay
// moved into the step of the bucket that brings its data reads stale bytes,
// and verification names a destination element.
TEST(StepsTest, ReplayFindsARelayInItsParentsStep) {
  const v1::TransferSpec spec = FanSpec(4, 256, 1024, 12.5e-6, 2.5e-6);
  v1::TransferSpec slow = spec;
  slow.mutable_options()->mutable_link_model()->set_nic_bytes_per_second(1e9);
  v1::Plan plan = BuildAndVerify(slow);
  ASSERT_TRUE(HasBucketSteps(plan));
  int moved = 0;
  for (v1::Bucket& b : *plan.mutable_buckets()) {
    if (b.step() > 0) {
      b.set_step(b.step() - 1);
      ++moved;
    }
  }
  ASSERT_GT(moved, 0);
  const absl::Status st = VerifyPlan(slow, plan);
  EXPECT_FALSE(st.ok()) << "a relay read bytes its own step brings";
}

// A step latency never makes a plan dearer under the model: the planner
// keeps the barrier schedule where the one searched for steps prices higher
// (Llama-3-8B to 32 replicas did: 51.3 -> 59.9 ms, its relays staged and its
// large-plan search weaker at hundreds of short rounds).
TEST(StepsTest, AStepLatencyNeverCostsMoreThanBarriers) {
  std::vector<v1::TransferSpec> specs;
  for (int n : {2, 8}) specs.push_back(FanSpec(n, 1024, 4096, 50e-6, 0));
  for (const char* dst : {"vllm-tp:1x4", "vllm-tp:2x4"}) {
    absl::StatusOr<catalog::CaseOptions> co = catalog::ParseCase("tiny-llama", "fsdp:2", dst);
    ASSERT_TRUE(co.ok()) << co.status();
    co->gpus_per_node = 1;
    absl::StatusOr<v1::TransferSpec> spec = catalog::BuildCase(*co);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->mutable_options()->mutable_link_model()->set_nic_bytes_per_second(1e8);
    specs.push_back(*spec);
  }
  for (v1::TransferSpec& spec : specs) {
    const v1::Plan barriers = BuildAndVerify(spec);
    spec.mutable_options()->mutable_link_model()->set_step_latency_seconds(10e-6);
    const v1::Plan steps = BuildAndVerify(spec);
    absl::StatusOr<SimulationResult> a = Simulate(spec, barriers);
    absl::StatusOr<SimulationResult> b = Simulate(spec, steps);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LE(b->makespan_seconds, a->makespan_seconds * (1 + 1e-9))
        << spec.destination().ranks_size() << " receivers";
  }
}

// A step outside [0, kMaxBucketSteps), or a local bucket's step other than
// 0, is refused by the simulator and the oracle, naming the bucket.
TEST(StepsTest, StepsOutOfRangeAreRefused) {
  const v1::TransferSpec spec = FanSpec(4, 256, 1024, 12.5e-6, 2.5e-6);
  v1::TransferSpec slow = spec;
  slow.mutable_options()->mutable_link_model()->set_nic_bytes_per_second(1e9);
  const v1::Plan plan = BuildAndVerify(slow);
  for (int32_t step : {-1, kMaxBucketSteps}) {
    v1::Plan bad = plan;
    bad.mutable_buckets(0)->set_step(step);
    absl::StatusOr<SimulationResult> sim = Simulate(slow, bad);
    EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument) << step;
    EXPECT_NE(sim.status().message().find("step"), std::string::npos) << sim.status();
    const absl::Status st = VerifyPlan(slow, bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("bucket 0"), std::string::npos) << st;
  }
}

// The simulator charges a round its steps one after the other: the round
// latency once, a step latency for each step after the first.
TEST(StepsTest, SimulatorAddsStepsOfARound) {
  v1::Plan plan;
  plan.set_num_rounds(1);
  auto add = [&](int32_t sender, int32_t receiver, int64_t bytes, int32_t step) {
    v1::Bucket* b = plan.add_buckets();
    b->set_id(plan.buckets_size() - 1);
    b->set_sender(sender);
    b->set_receiver(receiver);
    b->set_bytes(bytes);
    b->set_step(step);
  };
  add(0, 1, 1000, 0);
  add(1, 2, 1000, 1);
  add(0, 1, 500, 1);
  WorkerNodes nodes = {{0, "a"}, {1, "b"}, {2, "c"}};
  v1::LinkModel lm;
  lm.set_nic_bytes_per_second(1e6);
  lm.set_round_latency_seconds(1e-3);
  lm.set_step_latency_seconds(1e-4);
  absl::StatusOr<SimulationResult> sim = SimulatePlan(plan, nodes, lm);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_NEAR(sim->makespan_seconds, 1e-3 + 1e-3 + 1e-4 + 1e-3, 1e-12);
  EXPECT_EQ(sim->rounds[0].steps, 2);
  // The plan's cost alike (plan_cost.h EvaluatePlanCost).
  for (const auto& [worker, node] : std::map<int32_t, std::string>(nodes.begin(), nodes.end())) {
    v1::WorkerInfo* info = plan.add_workers();
    info->set_worker(worker);
    info->set_node(node);
  }
  absl::StatusOr<CostReport> cost = EvaluatePlanCost(plan, lm);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_NEAR(cost->predicted_seconds, sim->makespan_seconds, 1e-12);
  // A round whose first bucket moves in step 1 pays no step latency for the
  // empty step 0, in the simulator and the plan's cost alike.
  for (v1::Bucket& b : *plan.mutable_buckets()) b.set_step(b.step() + 1);
  sim = SimulatePlan(plan, nodes, lm);
  cost = EvaluatePlanCost(plan, lm);
  ASSERT_TRUE(sim.ok()) << sim.status();
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_NEAR(sim->makespan_seconds, 1e-3 + 1e-3 + 1e-4 + 1e-3, 1e-12);
  EXPECT_NEAR(cost->predicted_seconds, sim->makespan_seconds, 1e-12);
}

}  // namespace
}  // namespace wsync::plan
