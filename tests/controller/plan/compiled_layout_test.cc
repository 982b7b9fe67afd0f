// CompileSide on mesh placements and explicit fragments, against layouts
// computed by hand (torch.chunk / _StridedShard semantics).
#include "controller/plan/compiled_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/layout_test_util.h"

namespace wsync::plan {
namespace {

using ::testing::ElementsAre;
using namespace ::wsync::plan::testing;  // NOLINT: test builders

std::vector<BoxNd> Boxes(const std::vector<CompiledFragment>& frags) {
  std::vector<BoxNd> out;
  for (const auto& f : frags) out.push_back(f.box);
  return out;
}

TEST(CompileSideTest, ShardUnevenFiveRowsOverFourRanks) {
  v1::Side side = MakeSide(4);
  AddMesh(&side, "w", {5, 3}, {4}, {S(0)});
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  ASSERT_EQ(t.num_fragments(), 3u);  // rank 3's shard is empty: no fragment
  EXPECT_THAT(Boxes(OnRank(t, 0)), ElementsAre(B({0, 0}, {2, 3})));
  EXPECT_THAT(Boxes(OnRank(t, 1)), ElementsAre(B({2, 0}, {2, 3})));
  EXPECT_THAT(Boxes(OnRank(t, 2)), ElementsAre(B({4, 0}, {1, 3})));
  EXPECT_TRUE(OnRank(t, 3).empty());
  for (const auto& f : t.fragments()) {
    EXPECT_EQ(f.byte_offset, 0);
    EXPECT_EQ(f.strides, (DimVector{3, 1}));
    EXPECT_EQ(f.partial_group, 0);
    EXPECT_EQ(c->buffer_names[t.buffer(f)], "w");
  }
  EXPECT_EQ(c->workers, (std::vector<int32_t>{100, 101, 102, 103}));
  EXPECT_EQ(c->nodes[3], "node0");
  ASSERT_NE(c->Find("w"), nullptr);
  EXPECT_EQ(c->Find("missing"), nullptr);
}

TEST(CompileSideTest, TwoDimMeshShard0Shard1) {
  v1::Side side = MakeSide(4);
  AddMesh(&side, "w", {4, 6}, {2, 2}, {S(0), S(1)});
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      auto frags = OnRank(t, i * 2 + j);
      ASSERT_EQ(frags.size(), 1u);
      EXPECT_EQ(frags[0].box, B({2 * i, 3 * j}, {2, 3}));
      EXPECT_EQ(frags[0].strides, (DimVector{3, 1}));
      EXPECT_EQ(frags[0].byte_offset, 0);
    }
  }
  // Sorted by (box, rank).
  EXPECT_THAT(Boxes(t.fragments()), ElementsAre(B({0, 0}, {2, 3}), B({0, 3}, {2, 3}),
                                                B({2, 0}, {2, 3}), B({2, 3}, {2, 3})));
}

TEST(CompileSideTest, Shard0OnBothMeshDimsNestsChunks) {
  v1::Side side = MakeSide(4);
  // 7 rows: dim 0 -> [0,4) [4,7); then [0,4) -> [0,2) [2,4), [4,7) -> [4,6) [6,7).
  AddMesh(&side, "w", {7}, {2, 2}, {S(0), S(0)});
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  EXPECT_THAT(Boxes(OnRank(t, 0)), ElementsAre(B({0}, {2})));
  EXPECT_THAT(Boxes(OnRank(t, 1)), ElementsAre(B({2}, {2})));
  EXPECT_THAT(Boxes(OnRank(t, 2)), ElementsAre(B({4}, {2})));
  EXPECT_THAT(Boxes(OnRank(t, 3)), ElementsAre(B({6}, {1})));
}

TEST(CompileSideTest, ReplicateGivesEveryRankTheWholeTensor) {
  v1::Side side = MakeSide(3);
  AddMesh(&side, "w", {3, 4}, {3}, {R()}, {2, 0, 1}, v1::BF16);
  auto c = CompileSide(side, SideRole::kDestination);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  ASSERT_EQ(t.num_fragments(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(t.fragment(r).rank, r);  // same box: sorted by rank
    EXPECT_EQ(t.fragment(r).box, B({0, 0}, {3, 4}));
    EXPECT_EQ(t.fragment(r).partial_group, 0);
  }
}

TEST(CompileSideTest, PartialGroupsOnReplicatePartialMesh) {
  v1::Side side = MakeSide(4);
  // Mesh position p holds rank 3 - p: coords (0,0)->3, (0,1)->2, (1,0)->1, (1,1)->0.
  AddMesh(&side, "w", {2, 2}, {2, 2}, {R(), P(v1::REDUCE_AVG)}, {3, 2, 1, 0});
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  ASSERT_EQ(t.num_fragments(), 4u);
  std::vector<int32_t> group(4);
  for (const auto& f : t.fragments()) {
    EXPECT_EQ(f.box, B({0, 0}, {2, 2}));
    EXPECT_EQ(f.partial_op, v1::REDUCE_AVG);
    group[f.rank] = f.partial_group;
  }
  // Group = coordinate on the Replicate dim; ids dense from 1 in mesh order.
  EXPECT_EQ(group, (std::vector<int32_t>{2, 2, 1, 1}));
}

TEST(CompileSideTest, PartialWithShardGroupsByShardCoordinate) {
  v1::Side side = MakeSide(4);
  AddMesh(&side, "w", {4}, {2, 2}, {P(), S(0)});
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  // Ranks 0 and 2 hold rows [0,2) partially (group 1); ranks 1 and 3 rows [2,4) (group 2).
  for (const auto& f : t.fragments()) {
    const int j = f.rank % 2;
    EXPECT_EQ(f.box, B({2 * j}, {2}));
    EXPECT_EQ(f.partial_group, j + 1);
    EXPECT_EQ(f.partial_op, v1::REDUCE_SUM);
  }
}

TEST(CompileSideTest, StridedShardFsdpOverTpMatchesRightToLeftChunking) {
  v1::Side side = MakeSide(4);
  AddMesh(&side, "w", {8, 2}, {2, 2}, {SS(0, 2), S(0)});  // mesh (dp, tp)
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& t = c->tensors[0];
  // FSDP2 over TP: rank (i, j) = chunk(chunk(T, tp)[j], dp)[i] = rows [4j + 2i, +2).
  // (torch's docstring: (0,1) -> rows 4-5, (1,0) -> rows 2-3.)
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      EXPECT_THAT(Boxes(OnRank(t, i * 2 + j)), ElementsAre(B({4 * j + 2 * i, 0}, {2, 2})))
          << "dp " << i << " tp " << j;
    }
  }
}

TEST(CompileSideTest, StridedShardAloneGivesSeveralFragmentsPerRank) {
  v1::Side side = MakeSide(2);
  // Rows: chunks [0,4) [4,8), each cut in 2: rank 0 = rows 0-1 + 4-5, rank 1 = 2-3 + 6-7.
  AddMesh(&side, "rows", {8, 3}, {2}, {SS(0, 2)}, {}, v1::BF16);
  // Columns of a [2, 8] tensor: rank 0 = cols 0-1 + 4-5 in a local [2, 4] buffer.
  AddMesh(&side, "cols", {2, 8}, {2}, {SS(1, 2)}, {}, v1::FP32);
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  const CompiledTensor& rows = *c->Find("rows");
  auto r1 = OnRank(rows, 1);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].box, B({2, 0}, {2, 3}));
  EXPECT_EQ(r1[0].byte_offset, 0);
  EXPECT_EQ(r1[1].box, B({6, 0}, {2, 3}));
  EXPECT_EQ(r1[1].byte_offset, 2 * 3 * 2);  // after 2 local rows of 3 bf16
  EXPECT_EQ(r1[1].strides, (DimVector{3, 1}));

  const CompiledTensor& cols = *c->Find("cols");
  auto c0 = OnRank(cols, 0);
  ASSERT_EQ(c0.size(), 2u);
  EXPECT_EQ(c0[0].box, B({0, 0}, {2, 2}));
  EXPECT_EQ(c0[0].byte_offset, 0);
  EXPECT_EQ(c0[0].strides, (DimVector{4, 1}));
  EXPECT_EQ(c0[1].box, B({0, 4}, {2, 2}));
  EXPECT_EQ(c0[1].byte_offset, 2 * 4);  // local column 2, fp32
  EXPECT_EQ(c0[1].strides, (DimVector{4, 1}));
  EXPECT_EQ(c->buffer_names, (std::vector<std::string>{"rows", "cols"}));
}

TEST(CompileSideTest, StridedShardUnevenSplit) {
  // 7 rows, split_factor 2: chunks [0,4) [4,7); each over 2 ranks:
  // [0,2)[2,4) and [4,6)[6,7) -> rank 0 = 0-1 + 4-5, rank 1 = 2-3 + 6.
  auto iv = MeshLocalIntervals({7}, {2}, {1}, {SS(0, 2)});
  ASSERT_TRUE(iv.ok()) << iv.status();
  ASSERT_EQ((*iv)[0].size(), 2u);
  EXPECT_EQ((*iv)[0][0].begin, 2);
  EXPECT_EQ((*iv)[0][0].end, 4);
  EXPECT_EQ((*iv)[0][1].begin, 6);
  EXPECT_EQ((*iv)[0][1].end, 7);
  // split_factor 1 is plain Shard; contiguous pieces merge into one interval.
  auto one = MeshLocalIntervals({8}, {4}, {1}, {SS(0, 1)});
  ASSERT_TRUE(one.ok());
  ASSERT_EQ((*one)[0].size(), 1u);
  EXPECT_EQ((*one)[0][0].begin, 2);
  EXPECT_EQ((*one)[0][0].end, 4);
}

TEST(CompileSideTest, ExplicitFragmentsWithStrides) {
  v1::Side side = MakeSide(2);
  v1::TensorLayout* t = AddTensor(&side, "qkv", {4, 6}, v1::FP16);
  // Rank 0 keeps the two column halves in one [4, 6] row-major buffer "flat",
  // listed right half first: they interleave but share no byte.
  AddFragment(t, 0, B({0, 3}, {4, 3}), "flat", 6, {6, 1});
  AddFragment(t, 0, B({0, 0}, {4, 3}), "flat", 0, {6, 1});
  AddFragment(t, 1, B({0, 0}, {2, 6}));  // default buffer and strides
  AddFragment(t, 1, B({2, 0}, {0, 6}));  // empty: dropped
  auto c = CompileSide(side, SideRole::kDestination);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->buffer_names, (std::vector<std::string>{"flat", "qkv"}));
  const CompiledTensor& ct = c->tensors[0];
  ASSERT_EQ(ct.num_fragments(), 3u);
  EXPECT_EQ(ct.fragment(0).box, B({0, 0}, {2, 6}));
  EXPECT_EQ(ct.fragment(0).rank, 1);
  EXPECT_EQ(ct.fragment(0).strides, (DimVector{6, 1}));
  EXPECT_EQ(ct.buffer(ct.fragment(0)), 1);
  EXPECT_EQ(ct.fragment(1).box, B({0, 0}, {4, 3}));
  EXPECT_EQ(ct.fragment(1).byte_offset, 0);
  EXPECT_EQ(ct.fragment(2).box, B({0, 3}, {4, 3}));
  EXPECT_EQ(ct.fragment(2).byte_offset, 6);
  EXPECT_EQ(ct.buffer(ct.fragment(2)), 0);
  EXPECT_EQ(ct.fragment(2).strides, (DimVector{6, 1}));
}

TEST(CompileSideTest, ExplicitPartialGroupsAreCopied) {
  v1::Side side = MakeSide(2);
  v1::TensorLayout* t = AddTensor(&side, "w", {4});
  for (int r = 0; r < 2; ++r) {
    v1::Fragment* f = AddFragment(t, r, B({0}, {4}));
    f->set_partial_group(7);
    f->set_partial_op(v1::REDUCE_AVG);
  }
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const auto& f : c->tensors[0].fragments()) {
    EXPECT_EQ(f.partial_group, 7);
    EXPECT_EQ(f.partial_op, v1::REDUCE_AVG);
  }
}

TEST(CompileSideTest, SharedFlatBufferAcrossTensors) {
  // An FSDP-style flat buffer on each rank holds pieces of two tensors back to back.
  v1::Side side = MakeSide(1);
  AddFragment(AddTensor(&side, "a", {2, 4}), 0, B({0, 0}, {2, 4}), "flat", 0);
  AddFragment(AddTensor(&side, "b", {3}, v1::BF16), 0, B({0}, {3}), "flat", 32);
  auto c = CompileSide(side, SideRole::kDestination);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->buffer_names, (std::vector<std::string>{"flat"}));
  EXPECT_EQ(c->tensor_index.at("b"), 1);
}

TEST(CompileSideTest, SourceMayAliasTiedWeightsDestinationMayNot) {
  v1::Side side = MakeSide(1);
  AddFragment(AddTensor(&side, "embed", {8, 4}), 0, B({0, 0}, {8, 4}), "tied");
  AddFragment(AddTensor(&side, "lm_head", {8, 4}), 0, B({0, 0}, {8, 4}), "tied");
  EXPECT_TRUE(CompileSide(side, SideRole::kSource).ok());
  auto d = CompileSide(side, SideRole::kDestination);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), ::testing::HasSubstr("\"lm_head\""));
}

TEST(CompileSideTest, ScalarTensor) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "step", {}, {2}, {R()}, {}, v1::INT64);
  auto c = CompileSide(side, SideRole::kDestination);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tensors[0].num_fragments(), 2u);
  EXPECT_TRUE(c->tensors[0].fragment(0).box.offset.empty());
}

}  // namespace
}  // namespace wsync::plan
