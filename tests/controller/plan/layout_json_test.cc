// The JSON examples of docs/layout-spec.md parse (proto3 JSON mapping) and
// compile to the fragments the document lists.
#include <string>

#include "controller/plan/compiled_layout.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/layout_test_util.h"

namespace wsync::plan {
namespace {

using namespace ::wsync::plan::testing;  // NOLINT: test builders

v1::Side ParseSide(const std::string& json) {
  v1::Side side;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &side);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return side;
}

constexpr char kDocSide[] = R"json({
  "name": "trainer",
  "ranks": [ {"worker": 0, "node": "n0"}, {"worker": 1, "node": "n0"},
             {"worker": 2, "node": "n1"}, {"worker": 3, "node": "n1"} ],
  "tensors": [
    {"name": "w", "dtype": "BF16", "shape": [5, 3],
     "mesh": {"meshShape": [2], "ranks": [0, 1], "placements": [{"shard": {"dim": 0}}]}},
    {"name": "rows", "dtype": "FP32", "shape": [8, 3],
     "mesh": {"meshShape": [2], "ranks": [0, 1],
              "placements": [{"stridedShard": {"dim": 0, "splitFactor": 2}}]}},
    {"name": "grad_like", "dtype": "FP32", "shape": [2, 2],
     "mesh": {"meshShape": [2, 2], "ranks": [0, 1, 2, 3],
              "placements": [{"replicate": {}}, {"partial": {"op": "REDUCE_SUM"}}]}},
    {"name": "qkv", "dtype": "FP16", "shape": [4, 6],
     "fragments": {"fragments": [
       {"rank": 0, "box": {"offset": [0, 0], "length": [4, 3]}, "buffer": "flat",
        "byteOffset": 0, "strides": [6, 1]},
       {"rank": 0, "box": {"offset": [0, 3], "length": [4, 3]}, "buffer": "flat",
        "byteOffset": 6, "strides": [6, 1]},
       {"rank": 1, "box": {"offset": [0, 0], "length": [2, 6]}}
     ]}}
  ]
})json";

TEST(LayoutJsonTest, DocExamplesParseAndCompile) {
  const v1::Side side = ParseSide(kDocSide);
  auto c = CompileSide(side, SideRole::kSource);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->buffer_names, (std::vector<std::string>{"w", "rows", "grad_like", "flat", "qkv"}));

  const CompiledTensor& rows = *c->Find("rows");
  ASSERT_EQ(rows.num_fragments(), 4u);
  EXPECT_EQ(OnRank(rows, 0)[1].box, B({4, 0}, {2, 3}));
  EXPECT_EQ(OnRank(rows, 0)[1].byte_offset, 24);

  const CompiledTensor& g = *c->Find("grad_like");
  for (const auto& f : g.fragments()) EXPECT_EQ(f.partial_group, f.rank < 2 ? 1 : 2);

  const CompiledTensor& qkv = *c->Find("qkv");
  ASSERT_EQ(qkv.num_fragments(), 3u);
  EXPECT_EQ(qkv.fragment(0).strides, (DimVector{6, 1}));
  EXPECT_EQ(c->nodes[2], "n1");
}

TEST(LayoutJsonTest, SnakeCaseAndStringInt64Accepted) {
  const v1::Side side = ParseSide(R"json({
    "name": "s", "ranks": [{"worker": 7}, {"worker": 8}],
    "tensors": [{"name": "w", "dtype": "BF16", "shape": ["8", "2"],
      "mesh": {"mesh_shape": [2], "ranks": [1, 0],
               "placements": [{"strided_shard": {"dim": 0, "split_factor": 2}}]}}]})json");
  auto c = CompileSide(side, SideRole::kDestination);
  ASSERT_TRUE(c.ok()) << c.status();
  // Mesh position 0 is rank 1: rows 0-1 and 4-5.
  const auto frags = OnRank(c->tensors[0], 1);
  ASSERT_EQ(frags.size(), 2u);
  EXPECT_EQ(frags[0].box, B({0, 0}, {2, 2}));
  EXPECT_EQ(frags[1].box, B({4, 0}, {2, 2}));
  EXPECT_EQ(frags[1].byte_offset, 2 * 2 * 2);
}

}  // namespace
}  // namespace wsync::plan
