// Seeded random layouts: random meshes, placements, shapes, dtypes, rank
// overlaps, nodes, caps and relay settings. Every plan must replay to the
// exact destination values and respect every cap; layouts the compiler
// rejects are skipped (and counted, so the test cannot pass vacuously).
#include <random>
#include <string>
#include <vector>

#include "common/bucket_steps.h"
#include "controller/plan/plan_cost.h"
#include "controller/plan/planner.h"
#include "controller/plan/simulator.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

std::vector<int64_t> RandomMesh(Gen& g, int n) {
  std::vector<std::vector<int64_t>> options = {{n}};
  for (int a = 2; a < n; ++a) {
    if (n % a == 0) options.push_back({a, n / a});
  }
  return options[g.Int(0, static_cast<int>(options.size()) - 1)];
}

std::vector<v1::Placement> RandomPlacements(Gen& g, const std::vector<int64_t>& mesh, int rank,
                                            bool allow_partial) {
  std::vector<v1::Placement> out;
  for (size_t i = 0; i < mesh.size(); ++i) {
    const int kind = g.Int(0, allow_partial ? 4 : 3);
    if (rank == 0 || kind == 0) {
      out.push_back(Rep());
    } else if (kind <= 2) {
      out.push_back(Sh(g.Int(0, rank - 1)));
    } else if (kind == 3) {
      // _StridedShard only as FSDP-over-TP produces it: outer mesh dim, same
      // dim sharded again by the next mesh dim.
      if (i + 1 < mesh.size()) {
        const int d = g.Int(0, rank - 1);
        out.push_back(Strided(d, static_cast<int>(mesh[i + 1])));
        out.push_back(Sh(d));
        ++i;
      } else {
        out.push_back(Sh(g.Int(0, rank - 1)));
      }
    } else {
      out.push_back(Part(g.Coin(0.8) ? v1::REDUCE_SUM : v1::REDUCE_AVG));
    }
  }
  return out;
}

TEST(PlannerPropertyTest, RandomLayoutsReplayExactly) {
  int planned = 0, skipped = 0, stepped = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Gen g{std::mt19937_64(seed)};
    const int ns = g.Int(1, 8), nd = g.Int(1, 8);
    const int per_node = std::vector<int>{0, 2, 4}[g.Int(0, 2)];
    const int overlap = g.Int(0, 2);  // 0 disjoint, 1 partly colocated, 2 same workers
    const int32_t dst_base = overlap == 0 ? 100 : overlap == 1 ? ns / 2 : 0;
    v1::Side src = Side("trainer", Range(0, ns), per_node);
    v1::Side dst = Side("infer", Range(dst_base, nd), per_node);
    const int tensors = g.Int(1, 4);
    v1::TransferSpec spec;
    for (int t = 0; t < tensors; ++t) {
      const std::string name = "t" + std::to_string(t);
      const int rank = g.Int(0, 3);
      std::vector<int64_t> shape;
      for (int d = 0; d < rank; ++d) shape.push_back(g.Int(1, 9));
      const v1::DType sdt = std::vector<v1::DType>{v1::FP32, v1::BF16, v1::FP16}[g.Int(0, 2)];
      const v1::DType ddt =
          g.Coin(0.6) ? sdt : std::vector<v1::DType>{v1::FP32, v1::BF16, v1::FP16}[g.Int(0, 2)];
      const std::vector<int64_t> sm = RandomMesh(g, ns);
      const std::vector<int64_t> dm = RandomMesh(g, nd);
      Mesh(&src, name, shape, sm, RandomPlacements(g, sm, rank, true), sdt);
      Mesh(&dst, name, shape, dm, RandomPlacements(g, dm, rank, false), ddt);
    }
    spec = Spec(src, dst);
    for (v1::DType a : {v1::FP32, v1::BF16, v1::FP16}) {
      for (v1::DType b : {v1::FP32, v1::BF16, v1::FP16}) {
        if (a != b) AllowCast(&spec, a, b);
      }
    }
    const int64_t bucket = int64_t{1} << g.Int(3, 12);
    spec.mutable_options()->set_bucket_bytes(bucket);
    spec.mutable_options()->set_staging_cap_bytes(bucket * g.Int(1, 6));
    spec.mutable_options()->set_zero_copy_min_bytes(int64_t{1} << g.Int(2, 10));
    spec.mutable_options()->set_disable_relay(g.Coin(0.3));
    absl::StatusOr<CompiledSide> s = CompileSide(spec.source(), SideRole::kSource);
    absl::StatusOr<CompiledSide> d = CompileSide(spec.destination(), SideRole::kDestination);
    if (!s.ok() || !d.ok()) {
      ++skipped;
      continue;
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    BuildAndVerify(spec);
    ++planned;
    // Again on slow links with a step a fifth of a round: rounds merge into
    // steps next to reduces, casts, local copies and staged relays
    // (plan_steps.cc), and the oracle runs them as the engine does.
    v1::LinkModel* lm = spec.mutable_options()->mutable_link_model();
    lm->set_nic_bytes_per_second(1e6);
    lm->set_nvlink_bytes_per_second(4e6);
    lm->set_round_latency_seconds(50e-6);
    lm->set_step_latency_seconds(10e-6);
    const v1::Plan plan = BuildAndVerify(spec);
    stepped += HasBucketSteps(plan) ? 1 : 0;
    // The planner's summary, the plan's cost and the simulator price steps
    // alike.
    absl::StatusOr<WorkerNodes> nodes = WorkerNodesFromSpec(spec);
    ASSERT_TRUE(nodes.ok()) << nodes.status();
    absl::StatusOr<SimulationResult> sim = SimulatePlan(plan, *nodes, spec.options().link_model());
    absl::StatusOr<CostReport> cost = EvaluatePlanCost(plan, EffectiveLinkModel(spec.options()));
    ASSERT_TRUE(sim.ok()) << sim.status();
    ASSERT_TRUE(cost.ok()) << cost.status();
    const double predicted = plan.summary().predicted_seconds();
    EXPECT_NEAR(sim->makespan_seconds, predicted, 1e-9 * predicted);
    EXPECT_NEAR(cost->predicted_seconds, predicted, 1e-9 * predicted);
    if (HasFailure()) break;
  }
  EXPECT_GT(planned, 200) << "skipped " << skipped;
  EXPECT_GE(stepped, 10) << "plans with steps among " << planned;  // 14 of 297
}

}  // namespace
}  // namespace wsync::plan
