// Tensor classes (plan_classes.h): which tensors share a class, and that
// copying a class's cells gives the plan computing every tensor gives, byte
// for byte (BuildOptions::tensor_classes on and off), replayed exactly.
#include "controller/plan/plan_classes.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT
using planner_detail::TensorClasses;

struct Classes {
  TensorClasses k;
  int32_t copied = 0;
  int32_t box_words = 0;  // the box arena's size after the cells
  int32_t indexed = 0;    // source tensors whose SourceIndex was built
  std::vector<std::string> src_names, dst_names;
  int32_t Src(const std::string& name) const { return k.src_class[Index(src_names, name)]; }
  int32_t Dst(const std::string& name) const { return k.dst_class[Index(dst_names, name)]; }
  static size_t Index(const std::vector<std::string>& names, const std::string& name) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return i;
    }
    ADD_FAILURE() << "no tensor " << name;
    return 0;
  }
};

// The planner's stages up to the cells, and the classes they found.
Classes ClassesOf(const v1::TransferSpec& spec) {
  using namespace planner_detail;  // NOLINT
  Classes out;
  absl::StatusOr<CompiledSide> src = CompileSide(spec.source(), SideRole::kSource);
  absl::StatusOr<CompiledSide> dst = CompileSide(spec.destination(), SideRole::kDestination);
  EXPECT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  if (!src.ok() || !dst.ok()) return out;
  Work w;
  w.spec = &spec;
  w.src = &*src;
  w.dst = &*dst;
  EXPECT_TRUE(ResolveOptions(spec.options(), &w.opt).ok());
  w.opt.pack_bytes = w.opt.bucket_bytes;
  EXPECT_TRUE(IndexWorkers(&w).ok());
  EXPECT_TRUE(ValidateAndMap(&w).ok());
  absl::Status cells = BuildCells(&w, true, &out.copied);
  EXPECT_TRUE(cells.ok()) << cells;
  out.k = FindTensorClasses(w);
  out.box_words = w.boxes.end();
  for (const SourceIndex& si : w.source_index) out.indexed += si.built ? 1 : 0;
  for (const CompiledTensor& t : src->tensors) out.src_names.push_back(t.name);
  for (const CompiledTensor& t : dst->tensors) out.dst_names.push_back(t.name);
  return out;
}

// Plans `spec` with classes and without: the same bytes, and replayed.
void ExpectSamePlanEitherWay(const v1::TransferSpec& spec) {
  BuildOptions on, off;
  on.record_plan_seconds = off.record_plan_seconds = false;
  off.tensor_classes = false;
  absl::StatusOr<v1::Plan> a = BuildPlan(spec, on);
  absl::StatusOr<v1::Plan> b = BuildPlan(spec, off);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(DeterministicBytes(*a) == DeterministicBytes(*b))
      << "plans differ with tensor classes";
  absl::Status verified = VerifyPlan(spec, *a);
  EXPECT_TRUE(verified.ok()) << verified;
}

// Experts e0..e{n-1} [16, 8], FSDP over 4 trainer ranks -> 2 replicas of
// TP 2 (rows), plus a replicated norm [8].
v1::TransferSpec Experts(int n, v1::Side* src_out = nullptr, v1::Side* dst_out = nullptr) {
  v1::Side src = Side("trainer", Range(0, 4), 4);
  v1::Side dst = Side("infer", Range(4, 4), 4);
  for (int e = 0; e < n; ++e) {
    const std::string name = "e" + std::to_string(e);
    Mesh(&src, name, {16, 8}, {4}, {Sh(0)});
    Mesh(&dst, name, {16, 8}, {2, 2}, {Rep(), Sh(0)});
  }
  Mesh(&src, "norm", {8}, {4}, {Rep()});
  Mesh(&dst, "norm", {8}, {4}, {Rep()});
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(96);
  spec.mutable_options()->set_staging_cap_bytes(4096);
  return spec;
}

TEST(PlanClassesTest, AlikeTensorsShareAClassAndTheirCellsAreCopied) {
  const v1::TransferSpec spec = Experts(6);
  const Classes c = ClassesOf(spec);
  for (int e = 1; e < 6; ++e) {
    EXPECT_EQ(c.Dst("e" + std::to_string(e)), c.Dst("e0"));
    EXPECT_EQ(c.Src("e" + std::to_string(e)), c.Src("e0"));
  }
  EXPECT_NE(c.Dst("norm"), c.Dst("e0"));
  EXPECT_EQ(c.k.num_dst_classes, 2);
  EXPECT_EQ(c.copied, 5);
  ExpectSamePlanEitherWay(spec);
}

// Class members name their template's cell boxes, and tensors sharing a
// fragment list their first's holder-group boxes: six experts hold as many
// boxes as one; only the sources the computed members read are indexed (e0
// and the norm). Plans the same either way: ExpectSamePlanEitherWay.
TEST(PlanClassesTest, ClassMembersShareBoxesAndOnlyReadSourcesAreIndexed) {
  const Classes one = ClassesOf(Experts(1));
  const Classes six = ClassesOf(Experts(6));
  EXPECT_GT(one.box_words, 0);
  EXPECT_EQ(six.box_words, one.box_words);
  EXPECT_EQ(six.indexed, 2);
  ExpectSamePlanEitherWay(Experts(6));
}

// BuildOptions::stop_after_cells (measurement): CANCELLED once the cells
// are built, the stages measured up to there and none after.
TEST(PlanClassesTest, StopAfterCellsEndsPlanningAfterTheCells) {
  std::vector<StageCost> stages;
  BuildOptions build;
  build.stages = &stages;
  build.stop_after_cells = true;
  absl::StatusOr<v1::Plan> plan = BuildPlan(Experts(6), build);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kCancelled) << plan.status();
  EXPECT_NE(std::string(plan.status().message()).find("stopped after the cells stage"),
            std::string::npos);
  ASSERT_FALSE(stages.empty());
  EXPECT_EQ(stages.back().name.rfind("cells", 0), 0u) << stages.back().name;
}

TEST(PlanClassesTest, AnExpertOfAnotherShapeIsNotInTheClass) {
  v1::TransferSpec spec = Experts(4);
  for (v1::Side* side : {spec.mutable_source(), spec.mutable_destination()}) {
    side->mutable_tensors(3)->set_shape(1, 12);  // e3 [16, 12]
  }
  const Classes c = ClassesOf(spec);
  EXPECT_EQ(c.Dst("e1"), c.Dst("e0"));
  EXPECT_EQ(c.Dst("e2"), c.Dst("e0"));
  EXPECT_NE(c.Dst("e3"), c.Dst("e0"));
  EXPECT_NE(c.Src("e3"), c.Src("e0"));
  EXPECT_EQ(c.copied, 2);
  ExpectSamePlanEitherWay(spec);
}

TEST(PlanClassesTest, AnExpertWithAnotherShardSplitIsNotInTheClass) {
  // e2 is split by columns, e3 by rows at other boundaries (3, 8, 12): same
  // shape, dtype, ranks and destination as e0 and e1.
  v1::TransferSpec spec = Experts(4);
  v1::Side* src = spec.mutable_source();
  src->mutable_tensors(2)->mutable_mesh()->mutable_placements(0)->mutable_shard()->set_dim(1);
  v1::TensorLayout uneven;
  uneven.set_name("e3");
  uneven.set_dtype(v1::FP32);
  uneven.add_shape(16);
  uneven.add_shape(8);
  const int64_t cuts[] = {0, 3, 8, 12, 16};
  for (int r = 0; r < 4; ++r) {
    Frag(&uneven, r, {cuts[r], 0}, {cuts[r + 1] - cuts[r], 8}, "e3.flat", cuts[r] * 8 * 4);
  }
  *src->mutable_tensors(3) = uneven;
  const Classes c = ClassesOf(spec);
  EXPECT_EQ(c.Dst("e1"), c.Dst("e0"));
  EXPECT_NE(c.Src("e2"), c.Src("e0"));
  EXPECT_NE(c.Src("e3"), c.Src("e0"));
  EXPECT_NE(c.Src("e3"), c.Src("e2"));
  EXPECT_NE(c.Dst("e2"), c.Dst("e0"));
  EXPECT_NE(c.Dst("e3"), c.Dst("e0"));
  EXPECT_NE(c.Dst("e3"), c.Dst("e2"));
  EXPECT_EQ(c.copied, 1);
  ExpectSamePlanEitherWay(spec);
}

TEST(PlanClassesTest, EqualShapesWithOtherDestinationLayoutsAreNotOneClass) {
  // e1 is split by columns on the destination, e2 over TP 4 in one replica,
  // e3 keeps e0's boxes on other ranks (replicas swapped): a class of e0.
  v1::TransferSpec spec = Experts(4);
  v1::Side* dst = spec.mutable_destination();
  dst->mutable_tensors(1)->mutable_mesh()->mutable_placements(1)->mutable_shard()->set_dim(1);
  v1::MeshLayout* m2 = dst->mutable_tensors(2)->mutable_mesh();
  m2->set_mesh_shape(0, 1);
  m2->set_mesh_shape(1, 4);
  v1::MeshLayout* m3 = dst->mutable_tensors(3)->mutable_mesh();
  for (int i = 0; i < 4; ++i) m3->set_ranks(i, (i + 2) % 4);
  const Classes c = ClassesOf(spec);
  for (const char* t : {"e1", "e2", "e3"}) EXPECT_EQ(c.Src(t), c.Src("e0")) << t;
  EXPECT_NE(c.Dst("e1"), c.Dst("e0"));
  EXPECT_NE(c.Dst("e2"), c.Dst("e0"));
  EXPECT_NE(c.Dst("e2"), c.Dst("e1"));
  EXPECT_EQ(c.Dst("e3"), c.Dst("e0"));
  ExpectSamePlanEitherWay(spec);
}

TEST(PlanClassesTest, ReplicasAndRanksAreNotPartOfTheClass) {
  // e1 is held by two trainer ranks per shard (HSDP), e2 by other ranks:
  // the cells are e0's (source choice, after them, differs).
  v1::TransferSpec spec = Experts(3);
  v1::Side* src = spec.mutable_source();
  for (int r = 4; r < 8; ++r) src->add_ranks()->set_worker(100 + r);
  v1::MeshLayout* m1 = src->mutable_tensors(1)->mutable_mesh();
  m1->clear_mesh_shape();
  m1->add_mesh_shape(2);
  m1->add_mesh_shape(4);
  m1->clear_ranks();
  for (int r = 0; r < 8; ++r) m1->add_ranks(r);
  m1->clear_placements();
  *m1->add_placements() = Rep();
  *m1->add_placements() = Sh(0);
  v1::MeshLayout* m2 = src->mutable_tensors(2)->mutable_mesh();
  for (int i = 0; i < 4; ++i) m2->set_ranks(i, 4 + i);
  const Classes c = ClassesOf(spec);
  EXPECT_EQ(c.Dst("e1"), c.Dst("e0"));
  EXPECT_EQ(c.Dst("e2"), c.Dst("e0"));
  EXPECT_EQ(c.copied, 2);
  ExpectSamePlanEitherWay(spec);
}

TEST(PlanClassesTest, PartialOrOtherDtypeSourcesAreNotInTheClass) {
  v1::TransferSpec spec = Experts(3);
  v1::Side* src = spec.mutable_source();
  *src->mutable_tensors(1)->mutable_mesh()->mutable_placements(0) = Part();
  src->mutable_tensors(2)->set_dtype(v1::BF16);
  AllowCast(&spec, v1::BF16, v1::FP32);
  const Classes c = ClassesOf(spec);
  EXPECT_NE(c.Src("e1"), c.Src("e0"));
  EXPECT_NE(c.Src("e2"), c.Src("e0"));
  EXPECT_NE(c.Dst("e1"), c.Dst("e0"));
  EXPECT_NE(c.Dst("e2"), c.Dst("e0"));
  EXPECT_EQ(c.copied, 0);
  ExpectSamePlanEitherWay(spec);
}

// Layers l0..l3 of stacked experts w [2, 8, 4] fed by separate experts
// (2, 8, 4 each); l2 maps its experts into the other slots, l3 reads
// another row range of its experts.
TEST(PlanClassesTest, MappingEntriesArePartOfTheClass) {
  v1::Side src = Side("trainer", Range(0, 2), 2);
  v1::Side dst = Side("infer", Range(2, 2), 2);
  v1::TransferSpec spec;
  for (int l = 0; l < 4; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    for (int e = 0; e < 2; ++e) Mesh(&src, p + "e" + std::to_string(e), {12, 4}, {2}, {Sh(0)});
    Mesh(&dst, p + "w", {2, 8, 4}, {2}, {Sh(0)});
  }
  spec = Spec(src, dst);
  for (int l = 0; l < 4; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    for (int e = 0; e < 2; ++e) {
      const int64_t slot = l == 2 ? 1 - e : e;
      const int64_t row = l == 3 ? 4 : 0;
      Map(&spec, p + "w", {slot, 0, 0}, p + "e" + std::to_string(e), {row, 0}, {8, 4});
    }
  }
  spec.mutable_options()->set_bucket_bytes(64);
  const Classes c = ClassesOf(spec);
  EXPECT_EQ(c.Dst("l1.w"), c.Dst("l0.w"));
  EXPECT_NE(c.Dst("l2.w"), c.Dst("l0.w"));
  EXPECT_NE(c.Dst("l3.w"), c.Dst("l0.w"));
  EXPECT_NE(c.Dst("l3.w"), c.Dst("l2.w"));
  EXPECT_EQ(c.copied, 1);
  ExpectSamePlanEitherWay(spec);
}

// Block fp8 layers: fsdp:3 rows cut blocks (receiver-side quantization,
// QuantGroups rooted for relays over 2 replicas) and whole blocks (sender
// side). Layers l1 and l2 copy l0's cells, QuantGroups and forwarding cells.
TEST(PlanClassesTest, BlockFp8LayersCopyTheirQuantGroups) {
  v1::Side src = Side("trainer", Range(0, 3), 4);
  v1::Side dst = Side("infer", Range(4, 4), 2);
  for (int l = 0; l < 3; ++l) {
    const std::string name = "l" + std::to_string(l) + ".w";
    Mesh(&src, name, {512, 256}, {3}, {Sh(0)}, v1::BF16);
    v1::TensorLayout* t = Mesh(&dst, name, {512, 256}, {2, 2}, {Rep(), Sh(0)}, v1::FP8_E4M3);
    t->mutable_block_quantization()->set_scale_tensor(name + "_scale");
    Mesh(&dst, name + "_scale", {4, 2}, {2, 2}, {Rep(), Sh(0)}, v1::FP32);
  }
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(65536);
  const Classes c = ClassesOf(spec);
  EXPECT_EQ(c.Dst("l1.w"), c.Dst("l0.w"));
  EXPECT_EQ(c.Dst("l2.w"), c.Dst("l0.w"));
  EXPECT_EQ(c.Dst("l0.w_scale"), -1);  // written by quantization, no cells
  EXPECT_EQ(c.copied, 2);
  ExpectSamePlanEitherWay(spec);
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->quantizes_size() % 3, 0);
  EXPECT_GT(plan->quantizes_size(), 0);
  EXPECT_GT(plan->summary().num_relay_pieces(), 0);
}

}  // namespace
}  // namespace wsync::plan
