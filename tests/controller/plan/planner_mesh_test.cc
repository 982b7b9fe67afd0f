// All pairs of small meshes and placement kinds (uneven and empty shards,
// strided shards, partial, replicate), disjoint and colocated rank sets;
// every plan replayed and every destination element checked.
#include <functional>
#include <string>
#include <vector>

#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

struct Layout {
  std::string name;
  std::vector<int64_t> mesh;
  std::vector<v1::Placement> placements;
  bool source_only = false;  // partial placements
};

std::vector<Layout> Layouts(int n) {
  std::vector<Layout> out = {
      {"S0", {n}, {Sh(0)}},
      {"S1", {n}, {Sh(1)}},
      {"R", {n}, {Rep()}},
  };
  if (n % 2 == 0 && n >= 4) {
    out.push_back({"RxS0", {2, n / 2}, {Rep(), Sh(0)}});
    out.push_back({"S0xS1", {2, n / 2}, {Sh(0), Sh(1)}});
    out.push_back({"S0xS0", {2, n / 2}, {Sh(0), Sh(0)}});
    out.push_back({"SS0xS0", {2, n / 2}, {Strided(0, n / 2), Sh(0)}});
    out.push_back({"PxS1", {2, n / 2}, {Part(), Sh(1)}, true});
  }
  if (n >= 2) out.push_back({"P", {n}, {Part()}, true});
  return out;
}

class MeshPairTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(MeshPairTest, EveryPlacementPair) {
  const auto [ns, nd, colocated] = GetParam();
  for (const Layout& s : Layouts(ns)) {
    for (const Layout& d : Layouts(nd)) {
      if (d.source_only) continue;
      SCOPED_TRACE(s.name + " -> " + d.name);
      // Destination workers overlap the source ones when colocated.
      v1::Side src = Side("trainer", Range(0, ns), 4);
      v1::Side dst = Side("infer", Range(colocated ? ns / 2 : 100, nd), 4);
      // 7 x 5: uneven chunks and empty shards for meshes up to 8.
      Mesh(&src, "t", {7, 5}, s.mesh, s.placements);
      Mesh(&dst, "t", {7, 5}, d.mesh, d.placements);
      v1::TransferSpec spec = Spec(src, dst);
      BuildAndVerify(spec);
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, MeshPairTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(1, 2, 4, 5, 8),
                                            ::testing::Bool()));

}  // namespace
}  // namespace wsync::plan
