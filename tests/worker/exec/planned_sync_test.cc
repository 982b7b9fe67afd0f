// End to end on host memory: plans from the real planner (BuildPlan) for
// small specs, executed by every worker over Gloo loopback; every
// destination byte is checked against the global tensor.
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/bucket_steps.h"
#include "common/cast.h"
#include "common/plan_pieces.h"
#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/spec_helpers.h"

namespace wsync::exec {
namespace {

using plan::planner_testing::Part;
using plan::planner_testing::Rep;
using plan::planner_testing::Sh;
using testing::Box2d;
using testing::Cluster;
using testing::MakeSide;
using testing::RankBox;

// 1-D mesh over all ranks of the side.
void AddTensor(v1::Side* side, const std::string& name, std::vector<int64_t> shape, v1::DType dtype,
               const v1::Placement& placement) {
  v1::TensorLayout* t = side->add_tensors();
  t->set_name(name);
  t->set_dtype(dtype);
  for (int64_t n : shape) t->add_shape(n);
  v1::MeshLayout* m = t->mutable_mesh();
  m->add_mesh_shape(side->ranks_size());
  for (int i = 0; i < side->ranks_size(); ++i) m->add_ranks(i);
  *m->add_placements() = placement;
}

// Exactly representable in bf16 and fp32, so sums in any order agree.
float Global(int64_t i, int64_t j) {
  return static_cast<float>((i * 7 + j * 3) % 61) * 0.25f - 4.0f;
}

struct Case {
  v1::TransferSpec spec;
  int workers = 0;
};

// Registers every worker's local shard (2-D tensor [rows, cols], sharded on
// `dim` or replicated / partial), filling sources from Global().
void Register(Cluster& c, const v1::Side& side, BufferSide which, const v1::TensorLayout& t) {
  const int parts = side.ranks_size();
  const v1::Placement& p = t.mesh().placements(0);
  for (int r = 0; r < parts; ++r) {
    const Box2d box = RankBox(t.shape(0), t.shape(1), p, parts, r);
    const int64_t rows = box.rows, cols = box.cols, r0 = box.r0, c0 = box.c0;
    const int32_t w = side.ranks(r).worker();
    c.Add(w, which, t.name(), t.dtype(), rows * cols);
    if (which != BufferSide::kSource) continue;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        float v = Global(r0 + i, c0 + j);
        // Partial: rank r holds (v + r) for r < parts - 1, the last one the rest.
        if (p.has_partial())
          v = r + 1 < parts ? static_cast<float>(r + 1) : v - (parts - 1) * parts / 2.0f;
        if (t.dtype() == v1::FP32) {
          c.Data<float>(w, which, t.name())[i * cols + j] = v;
        } else {
          c.Data<uint16_t>(w, which, t.name())[i * cols + j] = FloatToBf16(v);
        }
      }
    }
  }
}

void CheckDestination(Cluster& c, const v1::Side& side, const v1::TensorLayout& t) {
  const int parts = side.ranks_size();
  const v1::Placement& p = t.mesh().placements(0);
  for (int r = 0; r < parts; ++r) {
    const Box2d box = RankBox(t.shape(0), t.shape(1), p, parts, r);
    const int64_t rows = box.rows, cols = box.cols, r0 = box.r0, c0 = box.c0;
    const int32_t w = side.ranks(r).worker();
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const float want = Global(r0 + i, c0 + j);
        if (t.dtype() == v1::FP32) {
          ASSERT_EQ(c.Data<float>(w, BufferSide::kDestination, t.name())[i * cols + j], want)
              << "worker " << w << " (" << i << "," << j << ")";
        } else {
          ASSERT_EQ(c.Data<uint16_t>(w, BufferSide::kDestination, t.name())[i * cols + j],
                    FloatToBf16(want))
              << "worker " << w << " (" << i << "," << j << ")";
        }
      }
    }
  }
}

// Each network bucket's sent and received checksums agree.
void ExpectChecksumsAgree(const std::vector<absl::StatusOr<SyncStats>>& results) {
  std::map<int64_t, std::map<bool, uint64_t>> hashes;  // bucket -> sent? -> hash
  for (const auto& r : results) {
    if (!r.ok()) continue;
    for (const BucketChecksum& c : r->checksums) hashes[c.bucket][c.sent] = c.hash;
  }
  EXPECT_FALSE(hashes.empty());
  for (const auto& [bucket, sides] : hashes) {
    ASSERT_EQ(sides.size(), 2u) << "bucket " << bucket;
    EXPECT_EQ(sides.at(true), sides.at(false)) << "bucket " << bucket;
  }
}

// `with_runs`: the planner must have written piece runs (BuildOptions::
// emit_piece_runs, on by default), which the workers bind and run.
// `with_steps`: it must have made steps (Bucket.step), checked by checksums.
void RunCase(const v1::TransferSpec& spec, int workers, bool with_runs = false,
             bool with_steps = false) {
  auto plan = plan::BuildPlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  if (with_runs) {
    ASSERT_TRUE(HasPieceRuns(*plan)) << "the planner wrote no piece run";
  }
  if (with_steps) {
    ASSERT_TRUE(HasBucketSteps(*plan)) << "the planner made no step";
  }
  Cluster c(workers);
  for (const v1::TensorLayout& t : spec.source().tensors()) {
    Register(c, spec.source(), BufferSide::kSource, t);
  }
  for (const v1::TensorLayout& t : spec.destination().tensors()) {
    Register(c, spec.destination(), BufferSide::kDestination, t);
  }
  ASSERT_TRUE(c.Connect().ok());
  for (int w = 0; w < workers; ++w) c.executor(w).set_checksums(with_steps);
  auto results = c.Run(*plan, absl::Seconds(60));
  bool all_ok = true;
  for (int w = 0; w < workers; ++w) {
    EXPECT_TRUE(results[w].ok()) << w << ": " << results[w].status();
    all_ok = all_ok && results[w].ok();
  }
  ASSERT_TRUE(all_ok);
  if (with_steps) ExpectChecksumsAgree(results);
  for (const v1::TensorLayout& t : spec.destination().tensors()) {
    CheckDestination(c, spec.destination(), t);
  }
}

void AllowCast(v1::TransferSpec* spec, v1::DType from, v1::DType to) {
  v1::Cast* c = spec->mutable_options()->add_allowed_casts();
  c->set_from(from);
  c->set_to(to);
}

TEST(PlannedSyncTest, RowShardedFp32ToColumnShardedBf16UnderTinyStaging) {
  v1::TransferSpec spec;
  *spec.mutable_source() = MakeSide("trainer", {0, 1});
  *spec.mutable_destination() = MakeSide("inference", {2, 3, 4});
  AddTensor(spec.mutable_source(), "w", {12, 10}, v1::FP32, Sh(0));
  AddTensor(spec.mutable_destination(), "w", {12, 10}, v1::BF16, Sh(1));
  AllowCast(&spec, v1::FP32, v1::BF16);
  spec.mutable_options()->set_bucket_bytes(64);
  spec.mutable_options()->set_staging_cap_bytes(128);
  RunCase(spec, 5);
}

TEST(PlannedSyncTest, ColocatedAndReplicatedDestination) {
  v1::TransferSpec spec;
  *spec.mutable_source() = MakeSide("trainer", {0, 1});
  *spec.mutable_destination() = MakeSide("inference", {1, 2, 3});
  AddTensor(spec.mutable_source(), "a", {16, 8}, v1::FP32, Sh(1));
  AddTensor(spec.mutable_destination(), "a", {16, 8}, v1::FP32, Rep());
  AddTensor(spec.mutable_source(), "b", {9, 4}, v1::FP32, Sh(0));
  AddTensor(spec.mutable_destination(), "b", {9, 4}, v1::FP32, Sh(0));
  RunCase(spec, 4);
}

TEST(PlannedSyncTest, PartialSourcesAreReduced) {
  v1::TransferSpec spec;
  *spec.mutable_source() = MakeSide("trainer", {0, 1, 2});
  *spec.mutable_destination() = MakeSide("inference", {3, 4});
  AddTensor(spec.mutable_source(), "p", {6, 6}, v1::FP32, Part());
  AddTensor(spec.mutable_destination(), "p", {6, 6}, v1::FP32, Sh(0));
  RunCase(spec, 5);
}

// Same-shaped tensors (as a layer's experts) cross in buckets of several
// pieces each; the planner writes them as runs, and every member is bound
// and moved as its own piece would be.
TEST(PlannedSyncTest, PieceRunsSyncEveryMemberLikeItsPiece) {
  v1::TransferSpec spec;
  *spec.mutable_source() = MakeSide("trainer", {0, 1});
  *spec.mutable_destination() = MakeSide("inference", {2, 3});
  for (int e = 0; e < 6; ++e) {
    const std::string name = "expert." + std::to_string(e);
    AddTensor(spec.mutable_source(), name, {8, 16}, v1::FP32, Sh(0));
    AddTensor(spec.mutable_destination(), name, {8, 16}, v1::FP32, Sh(1));
  }
  RunCase(spec, 4, /*with_runs=*/true);
}

// One tensor fanned out from one trainer to four replicas, every worker on
// a node of its own, with a round latency five times a step's: the planner
// relays the chunks within one round (steps), and each replica forwards a
// chunk straight from its tensor right behind the step that brought it.
TEST(PlannedSyncTest, FanOutRelaysWithinOneRound) {
  v1::TransferSpec spec;
  *spec.mutable_source() = MakeSide("trainer", {0});
  *spec.mutable_destination() = MakeSide("inference", {1, 2, 3, 4});
  for (v1::Side* side : {spec.mutable_source(), spec.mutable_destination()}) {
    for (v1::RankInfo& r : *side->mutable_ranks()) r.set_node(absl::StrCat("n", r.worker()));
  }
  AddTensor(spec.mutable_source(), "w", {256, 512}, v1::FP32, Rep());
  AddTensor(spec.mutable_destination(), "w", {256, 512}, v1::FP32, Rep());
  v1::LinkModel* lm = spec.mutable_options()->mutable_link_model();
  lm->set_nic_bytes_per_second(1e9);
  lm->set_round_latency_seconds(50e-6);
  lm->set_step_latency_seconds(10e-6);
  RunCase(spec, 5, /*with_runs=*/false, /*with_steps=*/true);
}

}  // namespace
}  // namespace wsync::exec
