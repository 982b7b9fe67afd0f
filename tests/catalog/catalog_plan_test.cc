// Plans every scaled-down catalog case (several trainer and vLLM layouts),
// replays the plan on host arrays with the replay oracle (every destination
// element checked), and cross-checks the planner's cost summary against the
// independent simulator.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "catalog/case.h"
#include "controller/plan/plan_estimate.h"
#include "controller/plan/planner.h"
#include "controller/plan/simulator.h"
#include "controller/verify/replay.h"
#include "gtest/gtest.h"

namespace wsync::catalog {
namespace {

struct Case {
  const char* model;
  const char* source;
  const char* destination;
  bool colocated;
  const char* experts;
  v1::DType trainer_dtype;
};

class CatalogPlanTest : public ::testing::TestWithParam<Case> {};

TEST_P(CatalogPlanTest, PlansReplaysAndMatchesSimulator) {
  const Case& c = GetParam();
  auto o = ParseCase(c.model, c.source, c.destination, c.experts);
  ASSERT_TRUE(o.ok()) << o.status();
  o->colocated = c.colocated;
  o->gpus_per_node = 4;
  o->trainer_dtype = c.trainer_dtype;
  auto spec = BuildCase(*o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = plan::BuildPlan(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->buckets_size(), 0);
  // The planner's early limit check (counted from the spec) bounds the plan.
  EXPECT_LE(plan::MinPiecesFromSpec(*spec), plan->summary().num_pieces());
  EXPECT_GT(plan::MinPiecesFromSpec(*spec), 0);
  absl::Status verified = plan::VerifyPlan(*spec, *plan);
  EXPECT_TRUE(verified.ok()) << verified;

  auto nodes = plan::WorkerNodesFromSpec(*spec);
  ASSERT_TRUE(nodes.ok());
  auto sim = plan::SimulatePlan(*plan, *nodes, spec->options().link_model());
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_GE(sim->makespan_seconds, sim->lower_bound_seconds);
  EXPECT_NEAR(sim->makespan_seconds, plan->summary().predicted_seconds(),
              1e-9 * sim->makespan_seconds);
  EXPECT_NEAR(sim->lower_bound_seconds, plan->summary().lower_bound_seconds(),
              1e-9 * sim->lower_bound_seconds);
  // The routing-independent bound holds for this plan and is at most the
  // plan's own bound plus two round latencies.
  const double routing = plan->summary().routing_bound_seconds();
  EXPECT_GT(routing, 0);
  EXPECT_LE(routing, sim->makespan_seconds * (1 + 1e-9)) << plan->summary().routing_bound_term();
  EXPECT_LE(routing,
            (sim->lower_bound_seconds + 2 * spec->options().link_model().round_latency_seconds()) *
                (1 + 1e-9));
  // Every destination byte arrives: network + local bytes cover the destination.
  EXPECT_GE(plan->summary().network_bytes() + plan->summary().local_bytes(),
            plan->summary().destination_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    TinyCases, CatalogPlanTest,
    ::testing::Values(
        Case{"tiny-llama", "fsdp:4", "vllm-tp:2x2", false, "", v1::FP32},
        Case{"tiny-llama", "hsdp:2x2", "vllm-tp:4", true, "", v1::BF16},
        Case{"tiny-llama", "megatron:tp2,pp2,dp1", "vllm-tp:8x1", false, "", v1::FP32},
        Case{"tiny-llama", "fsdp:8", "vllm-tp:2x4", true, "", v1::FP32},
        Case{"tiny-qwen3-moe", "fsdp:4", "vllm-tp:2x2", false, "", v1::BF16},
        Case{"tiny-qwen3-moe", "fsdp:4", "vllm-tp:4x1,ep", true, "stacked", v1::FP32},
        Case{"tiny-qwen3-moe", "megatron:tp2,pp2,dp2,ep2", "vllm-tp:2x2,ep", false, "", v1::FP32},
        Case{"tiny-qwen3-moe", "megatron:tp1,pp1,dp4,ep4", "vllm-tp:2x1", false, "separate",
             v1::BF16},
        Case{"tiny-mla", "fsdp:3", "vllm-tp:2x1", false, "", v1::FP32},
        Case{"tiny-mla", "megatron:tp2,pp3,dp2,ep2", "vllm-tp:4x2,ep", false, "", v1::BF16},
        Case{"tiny-mla", "hsdp:2x4", "vllm-tp:2x4", true, "separate", v1::FP32}),
    [](const ::testing::TestParamInfo<Case>& info) { return absl::StrCat("case", info.index); });

}  // namespace
}  // namespace wsync::catalog
