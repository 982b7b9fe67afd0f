// Mesh tensors of one signature share one compiled fragment vector
// (CompiledTensor::SharesFragmentsWith), while what differs per tensor (the
// buffer) stays per tensor: in the compiled side, in the overlap checks and
// in the plan's pieces.
#include <string>
#include <vector>

#include "common/plan_pieces.h"
#include "controller/plan/compiled_layout.h"
#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT: spec builders

const CompiledTensor& T(const CompiledSide& side, const std::string& name) {
  const CompiledTensor* t = side.Find(name);
  EXPECT_NE(t, nullptr) << name;
  return *t;
}

TEST(CompiledSharedTest, TensorsOfOneMeshSignatureShareOneFragmentVector) {
  v1::Side s = Side("trainer", Range(0, 4));
  Mesh(&s, "a", {16, 8}, {4}, {Sh(0)});
  Mesh(&s, "b", {16, 8}, {4}, {Sh(0)});                              // same signature
  Mesh(&s, "c", {16, 8}, {4}, {Sh(0)});                              // same again
  Mesh(&s, "shape", {16, 4}, {4}, {Sh(0)});                          // other shape
  Mesh(&s, "dim", {16, 8}, {4}, {Sh(1)});                            // other placement
  Mesh(&s, "ranks", {16, 8}, {4}, {Sh(0)}, v1::FP32, {3, 2, 1, 0});  // other ranks
  Mesh(&s, "dtype", {16, 8}, {4}, {Sh(0)}, v1::BF16);                // other byte offsets
  Mesh(&s, "mesh", {16, 8}, {2, 2}, {Rep(), Sh(0)});                 // other mesh
  absl::StatusOr<CompiledSide> c = CompileSide(s, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& a = T(*c, "a");
  EXPECT_TRUE(a.SharesFragmentsWith(T(*c, "b")));
  EXPECT_TRUE(a.SharesFragmentsWith(T(*c, "c")));
  for (const char* other : {"shape", "dim", "ranks", "dtype", "mesh"}) {
    EXPECT_FALSE(a.SharesFragmentsWith(T(*c, other))) << other;
  }
  ASSERT_EQ(a.num_fragments(), 4u);
  EXPECT_EQ(T(*c, "ranks").fragment(0).rank, 3);  // rank 3 holds rows [0, 4)
}

TEST(CompiledSharedTest, SharedFragmentsKeepEachTensorsOwnBuffer) {
  v1::Side s = Side("trainer", Range(0, 2));
  Mesh(&s, "a", {4, 2}, {2}, {Sh(0)});
  Mesh(&s, "b", {4, 2}, {2}, {Sh(0)});
  Mesh(&s, "c", {4, 2}, {2}, {Sh(0)})->mutable_mesh()->set_buffer("flat");
  absl::StatusOr<CompiledSide> c = CompileSide(s, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const char* name : {"a", "b", "c"}) {
    const CompiledTensor& t = T(*c, name);
    EXPECT_TRUE(t.SharesFragmentsWith(T(*c, "a"))) << name;
    for (const CompiledFragment& f : t.fragments()) {
      EXPECT_EQ(c->buffer_names[t.buffer(f)], std::string(name) == "c" ? "flat" : name);
    }
  }
}

TEST(CompiledSharedTest, OneSignatureInOneBufferStillOverlaps) {
  // Two tensors of one signature named into one buffer: each starts at byte
  // 0 of it, so their bytes overlap on every rank (a destination refuses it).
  v1::Side s = Side("vllm", Range(0, 2));
  Mesh(&s, "a", {4, 2}, {2}, {Sh(0)})->mutable_mesh()->set_buffer("flat");
  Mesh(&s, "b", {4, 2}, {2}, {Sh(0)})->mutable_mesh()->set_buffer("flat");
  absl::StatusOr<CompiledSide> c = CompileSide(s, SideRole::kDestination);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("buffer \"flat\""), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("tensor \"b\""), std::string::npos) << c.status();
}

TEST(CompiledSharedTest, PiecesOfTensorsSharingFragmentsReadTheirOwnBuffers) {
  v1::Side src = Side("trainer", Range(0, 4), 4);
  v1::Side dst = Side("infer", Range(4, 4), 4);
  for (int e = 0; e < 4; ++e) {
    const std::string name = "e" + std::to_string(e);
    Mesh(&src, name, {16, 8}, {4}, {Sh(0)});
    Mesh(&dst, name, {16, 8}, {2, 2}, {Rep(), Sh(0)});
  }
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(96);
  BuildOptions options;
  options.record_plan_seconds = false;
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckPlanRuns(*plan).ok());
  int pieces = 0;
  for (const v1::Bucket& b : plan->buckets()) {
    absl::Status s = ForEachPiece(b, [&](int64_t, const v1::Piece& p) {
      // Every tensor is its own buffer on both sides (the mesh default).
      EXPECT_EQ(plan->names(p.src().buffer_name()), plan->names(p.tensor_name()));
      EXPECT_EQ(plan->names(p.dst().buffer_name()), plan->names(p.tensor_name()));
      ++pieces;
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_GE(pieces, 16);  // 4 tensors x 4 source shards at least
  absl::Status verified = VerifyPlan(spec, *plan);
  EXPECT_TRUE(verified.ok()) << verified;
}

}  // namespace
}  // namespace wsync::plan
