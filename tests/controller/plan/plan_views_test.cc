// Shared TensorViews on arena plans (controller/plan/plan_views.h): the
// table hands out one view per distinct content, and a plan built on an
// arena, where pieces share views, is byte for byte the plan built on the
// heap, where every piece owns its views.
#include "controller/plan/plan_views.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "controller/plan/plan_arena.h"
#include "controller/plan/rank_parts.h"
#include "google/protobuf/arena.h"
#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT
using planner_detail::ViewFields;
using planner_detail::ViewTable;

TEST(ViewTableTest, EqualFieldsGiveOneViewAndAnyDifferenceAnother) {
  google::protobuf::Arena arena;
  ViewTable table(&arena);
  ASSERT_TRUE(table.interning());
  const int64_t shape[] = {4, 8}, strides[] = {8, 1};
  ViewFields f;
  f.buffer_name = 3;
  f.byte_offset = 64;
  f.rank = 2;
  f.shape = shape;
  f.strides = strides;
  f.dtype = v1::BF16;
  f.side = v1::DESTINATION_BUFFER;
  v1::TensorView* v = table.Get(f);
  EXPECT_EQ(v->GetArena(), &arena);
  EXPECT_EQ(v->buffer_name(), 3);
  EXPECT_EQ(v->byte_offset(), 64);
  EXPECT_EQ(std::vector<int64_t>(v->shape().begin(), v->shape().end()),
            std::vector<int64_t>({4, 8}));
  EXPECT_EQ(std::vector<int64_t>(v->strides().begin(), v->strides().end()),
            std::vector<int64_t>({8, 1}));
  EXPECT_EQ(v->dtype(), v1::BF16);
  EXPECT_EQ(v->side(), v1::DESTINATION_BUFFER);
  const int64_t same_shape[] = {4, 8};  // equal content at another address
  ViewFields g = f;
  g.shape = same_shape;
  EXPECT_EQ(table.Get(g), v);
  const int64_t other_shape[] = {4, 9}, other_strides[] = {9, 1};
  std::vector<ViewFields> variants(7, f);
  variants[0].buffer_name = 4;
  variants[1].byte_offset = 65;
  variants[2].rank = 1;
  variants[3].shape = other_shape;
  variants[4].strides = other_strides;
  variants[5].dtype = v1::FP32;
  variants[6].side = v1::SOURCE_BUFFER;
  absl::flat_hash_set<const v1::TensorView*> seen = {v};
  for (const ViewFields& x : variants) {
    EXPECT_TRUE(seen.insert(table.Get(x)).second) << "a different view was shared";
  }
  EXPECT_EQ(table.size(), 8u);
  EXPECT_FALSE(ViewTable(nullptr).interning());
}

// Replicated destinations (the same views on every replica) and a source
// sharded over a few ranks, with relays and fp8 blocks sometimes.
v1::TransferSpec ReplicatedSpec(Gen& g) {
  const int src_n = g.Int(1, 4), replicas = g.Int(2, 4), tp = g.Coin() ? 1 : 2;
  v1::Side src = Side("trainer", Range(0, src_n), g.Int(0, 2));
  v1::Side dst = Side("infer", Range(src_n, replicas * tp), g.Int(1, 2));
  const int tensors = g.Int(1, 5);
  for (int i = 0; i < tensors; ++i) {
    const std::string name = "t" + std::to_string(i);
    std::vector<int64_t> shape = {4 * g.Int(1, 4), 2 * g.Int(1, 4)};
    const v1::DType dtype = g.Coin() ? v1::FP32 : v1::BF16;
    Mesh(&src, name, shape, {src_n}, {g.Coin() ? Sh(g.Int(0, 1)) : Rep()}, dtype, Range(0, src_n));
    const bool fp8 = g.Coin(0.3);
    v1::TensorLayout* t =
        Mesh(&dst, name, shape, {replicas, tp}, {Rep(), Sh(0)}, fp8 ? v1::FP8_E4M3 : dtype);
    if (!fp8) continue;
    t->mutable_block_quantization()->set_scale_tensor(name + "_scale");
    t->mutable_block_quantization()->add_block(2);
    t->mutable_block_quantization()->add_block(2);
    Mesh(&dst, name + "_scale", {shape[0] / 2, shape[1] / 2}, {replicas, tp}, {Rep(), Sh(0)},
         v1::FP32);
  }
  v1::TransferSpec spec = Spec(src, dst);
  AllowCast(&spec, v1::FP32, v1::BF16);
  AllowCast(&spec, v1::BF16, v1::FP32);
  spec.mutable_options()->set_bucket_bytes(int64_t{16} << g.Int(0, 4));
  spec.mutable_options()->set_disable_relay(g.Coin(0.3));
  return spec;
}

TEST(PlanViewsTest, ArenaPlansShareViewsAndEqualHeapPlansByteForByte) {
  int planned = 0, shared = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Gen g{std::mt19937_64(seed)};
    const v1::TransferSpec spec = ReplicatedSpec(g);
    BuildOptions opt;
    opt.record_plan_seconds = false;
    absl::StatusOr<v1::Plan> heap = BuildPlan(spec, opt);
    std::shared_ptr<google::protobuf::Arena> arena = NewPlanArena();
    v1::Plan* on_arena = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
    const absl::Status built = BuildPlanInto(spec, on_arena, opt);
    ASSERT_EQ(heap.ok(), built.ok()) << heap.status() << " / " << built;
    if (!built.ok()) continue;
    ASSERT_TRUE(DeterministicBytes(*heap) == DeterministicBytes(*on_arena))
        << "the arena plan differs from the heap plan";
    absl::Status verified = VerifyPlan(spec, *on_arena);
    ASSERT_TRUE(verified.ok()) << verified;
    // Per-worker parts are deep copies: the same whichever plan they split.
    const std::vector<RankPart> a = SplitRankPlans(*on_arena), b = SplitRankPlans(*heap);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(DeterministicBytes(*a[i].plan) == DeterministicBytes(*b[i].plan));
    }
    ++planned;
    int64_t views = 0;
    absl::flat_hash_set<const v1::TensorView*> distinct;
    for (const v1::Bucket& bk : on_arena->buckets()) {
      std::vector<const v1::Piece*> stored;  // plain pieces and each run's first
      for (const v1::Piece& p : bk.pieces()) stored.push_back(&p);
      for (const v1::PieceRun& r : bk.runs()) stored.push_back(&r.first());
      for (const v1::Piece* piece : stored) {
        const v1::Piece& p = *piece;
        for (const v1::TensorView* v : {&p.src(), &p.dst()}) {
          if (v == &v1::TensorView::default_instance()) continue;  // a scale piece's src
          ++views;
          distinct.insert(v);
          EXPECT_EQ(v->GetArena(), arena.get());
        }
      }
    }
    if (static_cast<int64_t>(distinct.size()) < views) ++shared;
  }
  EXPECT_GT(planned, 50);
  EXPECT_GT(shared, planned / 2) << "replicas' identical views were not shared";
}

}  // namespace
}  // namespace wsync::plan
