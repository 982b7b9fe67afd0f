// Builders against hand-computed vLLM layouts (small dims).
#include "catalog/vllm_layout.h"

#include <tuple>

#include "gtest/gtest.h"

namespace wsync::catalog {
namespace {

using V = std::vector<int64_t>;

// (dst_offset, src, src_offset, src_length) of every mapping.
using M = std::tuple<V, std::string, V, V>;
std::vector<M> Mappings(const BuiltGroup& g) {
  std::vector<M> out;
  for (const auto& m : g.mappings) {
    out.emplace_back(V(m.dst_offset().begin(), m.dst_offset().end()), m.src(),
                     V(m.src_box().offset().begin(), m.src_box().offset().end()),
                     V(m.src_box().length().begin(), m.src_box().length().end()));
  }
  return out;
}

// (rank, offset, length, buffer, byte_offset) of every fragment.
using F = std::tuple<int, V, V, std::string, int64_t>;
std::vector<F> Fragments(const v1::TensorLayout& t) {
  std::vector<F> out;
  for (const auto& f : t.fragments().fragments()) {
    out.emplace_back(f.rank(), V(f.box().offset().begin(), f.box().offset().end()),
                     V(f.box().length().begin(), f.box().length().end()), f.buffer(),
                     f.byte_offset());
  }
  return out;
}
V Shape(const v1::TensorLayout& t) { return V(t.shape().begin(), t.shape().end()); }

TEST(VllmLayoutTest, FusedQkvGqa) {
  // 4 q heads, 2 kv heads, head_dim 2, hidden 3, tp 2: rank r = [q 2 heads; k 1; v 1].
  auto g = BuildFusedQkv("a.", 4, 2, 2, 3, v1::BF16, {2, 1});
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->tensors.size(), 1u);
  EXPECT_EQ(g->tensors[0].name(), "a.qkv_proj.weight");
  EXPECT_EQ(Shape(g->tensors[0]), (V{16, 3}));
  EXPECT_EQ(Fragments(g->tensors[0]),
            (std::vector<F>{{0, {0, 0}, {8, 3}, "a.qkv_proj.weight", 0},
                            {1, {8, 0}, {8, 3}, "a.qkv_proj.weight", 0}}));
  EXPECT_EQ(Mappings(*g), (std::vector<M>{{{0, 0}, "a.q_proj.weight", {0, 0}, {4, 3}},
                                          {{4, 0}, "a.k_proj.weight", {0, 0}, {2, 3}},
                                          {{6, 0}, "a.v_proj.weight", {0, 0}, {2, 3}},
                                          {{8, 0}, "a.q_proj.weight", {4, 0}, {4, 3}},
                                          {{12, 0}, "a.k_proj.weight", {2, 0}, {2, 3}},
                                          {{14, 0}, "a.v_proj.weight", {2, 0}, {2, 3}}}));
}

TEST(VllmLayoutTest, FusedQkvTpAboveKvHeadsReplicatesKv) {
  // tp 4 > 2 kv heads: every rank has 1 q head and kv head r / 2.
  auto g = BuildFusedQkv("a.", 4, 2, 2, 3, v1::BF16, {4, 1});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Shape(g->tensors[0]), (V{24, 3}));
  const auto m = Mappings(*g);
  ASSERT_EQ(m.size(), 12u);
  EXPECT_EQ(m[1], (M{{2, 0}, "a.k_proj.weight", {0, 0}, {2, 3}}));   // rank 0
  EXPECT_EQ(m[4], (M{{8, 0}, "a.k_proj.weight", {0, 0}, {2, 3}}));   // rank 1 same head
  EXPECT_EQ(m[6], (M{{12, 0}, "a.q_proj.weight", {4, 0}, {2, 3}}));  // rank 2 q head 2
  EXPECT_EQ(m[8], (M{{16, 0}, "a.v_proj.weight", {2, 0}, {2, 3}}));  // rank 2 kv head 1
  EXPECT_EQ(m[11], (M{{22, 0}, "a.v_proj.weight", {2, 0}, {2, 3}}));
  EXPECT_FALSE(BuildFusedQkv("a.", 4, 2, 2, 3, v1::BF16, {3, 1}).ok());
  EXPECT_TRUE(BuildFusedQkv("a.", 8, 4, 2, 3, v1::BF16, {8, 1}).ok());   // 8 / 4 divides
  EXPECT_FALSE(BuildFusedQkv("a.", 6, 3, 2, 3, v1::BF16, {2, 1}).ok());  // 3 kv heads / 2
}

TEST(VllmLayoutTest, GateUpWithReplicas) {
  auto g = BuildGateUp("gu", "g", "u", 4, 3, v1::BF16, {2, 2});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Shape(g->tensors[0]), (V{8, 3}));
  EXPECT_EQ(Fragments(g->tensors[0]), (std::vector<F>{{0, {0, 0}, {4, 3}, "gu", 0},
                                                      {1, {4, 0}, {4, 3}, "gu", 0},
                                                      {2, {0, 0}, {4, 3}, "gu", 0},
                                                      {3, {4, 0}, {4, 3}, "gu", 0}}));
  EXPECT_EQ(Mappings(*g), (std::vector<M>{{{0, 0}, "g", {0, 0}, {2, 3}},
                                          {{2, 0}, "u", {0, 0}, {2, 3}},
                                          {{4, 0}, "g", {2, 0}, {2, 3}},
                                          {{6, 0}, "u", {2, 0}, {2, 3}}}));
  EXPECT_FALSE(BuildGateUp("gu", "g", "u", 5, 3, v1::BF16, {2, 1}).ok());
}

TEST(VllmLayoutTest, RowAndColumnParallel) {
  auto row = BuildRowParallel("o", 3, 4, v1::BF16, {2, 1});
  ASSERT_TRUE(row.ok());
  EXPECT_TRUE(row->mappings.empty());  // same name and shape as the source
  EXPECT_EQ(Fragments(row->tensors[0]),
            (std::vector<F>{{0, {0, 0}, {3, 2}, "o", 0}, {1, {0, 2}, {3, 2}, "o", 0}}));
  auto col = BuildColumnParallel("c", 4, 3, v1::BF16, {2, 1});
  ASSERT_TRUE(col.ok());
  EXPECT_EQ(Fragments(col->tensors[0]),
            (std::vector<F>{{0, {0, 0}, {2, 3}, "c", 0}, {1, {2, 0}, {2, 3}, "c", 0}}));
  auto bad = BuildRowParallel("o", 3, 5, v1::BF16, {2, 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("o columns"), std::string::npos);
}

TEST(VllmLayoutTest, PaddedVocabCoversOnlyRealRows) {
  EXPECT_EQ(PaddedVocab(100), 128);
  // vLLM pads to 64 whatever the tp: Llama-3's 128256 rows stay 128256 at tp 8.
  EXPECT_EQ(PaddedVocab(128256), 128256);
  auto g = BuildPaddedVocab("emb", 100, 3, v1::BF16, {2, 1});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Shape(g->tensors[0]), (V{128, 3}));
  EXPECT_EQ(Fragments(g->tensors[0]),
            (std::vector<F>{{0, {0, 0}, {64, 3}, "emb", 0}, {1, {64, 0}, {36, 3}, "emb", 0}}));
  EXPECT_EQ(Mappings(*g), (std::vector<M>{{{0, 0}, "emb", {0, 0}, {100, 3}}}));
  // tp 4: padded to 128, 32 rows each; rank 3 holds 4 real rows and 28 of padding.
  auto g4 = BuildPaddedVocab("emb", 100, 3, v1::BF16, {4, 1});
  ASSERT_TRUE(g4.ok());
  EXPECT_EQ(Shape(g4->tensors[0]), (V{128, 3}));
  EXPECT_EQ(Fragments(g4->tensors[0]), (std::vector<F>{{0, {0, 0}, {32, 3}, "emb", 0},
                                                       {1, {32, 0}, {32, 3}, "emb", 0},
                                                       {2, {64, 0}, {32, 3}, "emb", 0},
                                                       {3, {96, 0}, {4, 3}, "emb", 0}}));
  // tp 8 with a vocab of 10 rows: 64 rows, 8 per rank; ranks 2-7 hold only padding.
  auto g8 = BuildPaddedVocab("emb", 10, 3, v1::BF16, {8, 1});
  ASSERT_TRUE(g8.ok());
  EXPECT_EQ(Fragments(g8->tensors[0]),
            (std::vector<F>{{0, {0, 0}, {8, 3}, "emb", 0}, {1, {8, 0}, {2, 3}, "emb", 0}}));
  // The padded vocab must divide by tp, as vLLM's divide() asserts.
  auto bad = BuildPaddedVocab("emb", 100, 3, v1::BF16, {3, 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("emb padded vocab"), std::string::npos);
}

TEST(VllmLayoutTest, ReplicatedConcat) {
  BuiltGroup g = BuildReplicatedConcat("f", {{"qa", 2}, {"kva", 3}}, 4, v1::BF16, {1, 2});
  EXPECT_EQ(Shape(g.tensors[0]), (V{5, 4}));
  EXPECT_EQ(Fragments(g.tensors[0]),
            (std::vector<F>{{0, {0, 0}, {5, 4}, "f", 0}, {1, {0, 0}, {5, 4}, "f", 0}}));
  EXPECT_EQ(Mappings(g),
            (std::vector<M>{{{0, 0}, "qa", {0, 0}, {2, 4}}, {{2, 0}, "kva", {0, 0}, {3, 4}}}));
}

TEST(VllmLayoutTest, StackedExpertsTensorParallelFromStackedSource) {
  // E 2, I 4, H 3, tp 2: w13 [2, 8, 3], rank r = [gate_r; up_r] per expert.
  auto g = BuildStackedExperts("m.", 2, 4, 3, v1::BF16, ExpertStyle::kStacked, {2, 1});
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->tensors.size(), 2u);
  EXPECT_EQ(Shape(g->tensors[0]), (V{2, 8, 3}));
  EXPECT_EQ(Fragments(g->tensors[0]),
            (std::vector<F>{{0, {0, 0, 0}, {2, 4, 3}, "m.experts.w13_weight", 0},
                            {1, {0, 4, 0}, {2, 4, 3}, "m.experts.w13_weight", 0}}));
  EXPECT_EQ(Mappings(*g),
            (std::vector<M>{{{0, 0, 0}, "m.experts.gate_proj", {0, 0, 0}, {2, 2, 3}},
                            {{0, 2, 0}, "m.experts.up_proj", {0, 0, 0}, {2, 2, 3}},
                            {{0, 4, 0}, "m.experts.gate_proj", {0, 2, 0}, {2, 2, 3}},
                            {{0, 6, 0}, "m.experts.up_proj", {0, 2, 0}, {2, 2, 3}},
                            {{0, 0, 0}, "m.experts.down_proj", {0, 0, 0}, {2, 3, 4}}}));
  EXPECT_EQ(Shape(g->tensors[1]), (V{2, 3, 4}));
  EXPECT_EQ(Fragments(g->tensors[1]),
            (std::vector<F>{{0, {0, 0, 0}, {2, 3, 2}, "m.experts.w2_weight", 0},
                            {1, {0, 0, 2}, {2, 3, 2}, "m.experts.w2_weight", 0}}));
}

TEST(VllmLayoutTest, StackedExpertsTensorParallelFromSeparateSources) {
  // Expert 1's slice of w13 on rank r sits after expert 0's: 2*I_r*H*2 = 24 bytes.
  auto g = BuildStackedExperts("m.", 2, 4, 3, v1::BF16, ExpertStyle::kSeparate, {2, 1});
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->tensors.size(), 4u);  // w13.0, w2.0, w13.1, w2.1
  EXPECT_EQ(g->tensors[2].name(), "m.experts.w13_weight.1");
  EXPECT_EQ(Fragments(g->tensors[2]),
            (std::vector<F>{{0, {0, 0}, {4, 3}, "m.experts.w13_weight", 24},
                            {1, {4, 0}, {4, 3}, "m.experts.w13_weight", 24}}));
  EXPECT_EQ(Fragments(g->tensors[3]),
            (std::vector<F>{{0, {0, 0}, {3, 2}, "m.experts.w2_weight", 12},
                            {1, {0, 2}, {3, 2}, "m.experts.w2_weight", 12}}));
  const auto m = Mappings(*g);
  EXPECT_EQ(m[5], (M{{0, 0}, "m.experts.1.gate_proj.weight", {0, 0}, {2, 3}}));
  EXPECT_EQ(m[9], (M{{0, 0}, "m.experts.1.down_proj.weight", {0, 0}, {3, 4}}));
}

TEST(VllmLayoutTest, StackedExpertsExpertParallel) {
  // E 4 over 2 ranks, 2 replicas: expert 3 is local expert 1 of rank 1 (and 3).
  auto g = BuildStackedExperts("m.", 4, 2, 3, v1::BF16, ExpertStyle::kSeparate, {2, 2, true});
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->tensors.size(), 8u);
  EXPECT_EQ(g->tensors[6].name(), "m.experts.w13_weight.3");
  EXPECT_EQ(Fragments(g->tensors[6]),
            (std::vector<F>{{1, {0, 0}, {4, 3}, "m.experts.w13_weight", 24},
                            {3, {0, 0}, {4, 3}, "m.experts.w13_weight", 24}}));
  EXPECT_EQ(Fragments(g->tensors[7]),
            (std::vector<F>{{1, {0, 0}, {3, 2}, "m.experts.w2_weight", 12},
                            {3, {0, 0}, {3, 2}, "m.experts.w2_weight", 12}}));
  auto s = BuildStackedExperts("m.", 4, 2, 3, v1::BF16, ExpertStyle::kStacked, {2, 1, true});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Fragments(s->tensors[0]),
            (std::vector<F>{{0, {0, 0, 0}, {2, 4, 3}, "m.experts.w13_weight", 0},
                            {1, {2, 0, 0}, {2, 4, 3}, "m.experts.w13_weight", 0}}));
  EXPECT_EQ(Mappings(*s),
            (std::vector<M>{{{0, 0, 0}, "m.experts.gate_proj", {0, 0, 0}, {4, 2, 3}},
                            {{0, 2, 0}, "m.experts.up_proj", {0, 0, 0}, {4, 2, 3}},
                            {{0, 0, 0}, "m.experts.down_proj", {0, 0, 0}, {4, 3, 2}}}));
  EXPECT_FALSE(
      BuildStackedExperts("m.", 3, 2, 3, v1::BF16, ExpertStyle::kStacked, {2, 1, true}).ok());
}

}  // namespace
}  // namespace wsync::catalog
