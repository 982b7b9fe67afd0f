// CompileSide rejects malformed sides with messages that name the side,
// tensor, rank and box involved.
#include "controller/plan/compiled_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/layout_test_util.h"

namespace wsync::plan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace ::wsync::plan::testing;  // NOLINT: test builders

// Compiles and returns the error message ("" when it compiled).
std::string Error(const v1::Side& side, SideRole role = SideRole::kSource) {
  auto c = CompileSide(side, role);
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

TEST(LayoutValidationTest, EmptySide) {
  v1::Side no_ranks;
  no_ranks.set_name("src");
  AddMesh(&no_ranks, "w", {4}, {1}, {R()});
  EXPECT_THAT(Error(no_ranks), AllOf(HasSubstr("\"src\""), HasSubstr("no ranks")));
  EXPECT_THAT(Error(MakeSide(2, "dst"), SideRole::kDestination),
              AllOf(HasSubstr("destination side \"dst\""), HasSubstr("no tensors")));
}

TEST(LayoutValidationTest, DuplicateWorker) {
  v1::Side side = MakeSide(3);
  side.mutable_ranks(2)->set_worker(100);
  AddMesh(&side, "w", {4}, {3}, {R()});
  EXPECT_THAT(Error(side), HasSubstr("ranks 0 and 2 both have worker id 100"));
}

TEST(LayoutValidationTest, DuplicateTensorName) {
  v1::Side side = MakeSide(1);
  AddMesh(&side, "w", {4}, {1}, {R()});
  AddMesh(&side, "w", {4}, {1}, {R()});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("duplicate tensor name")));
}

TEST(LayoutValidationTest, DtypeUnspecified) {
  v1::Side side = MakeSide(1);
  AddMesh(&side, "w", {4}, {1}, {R()}, {}, v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("DTYPE_UNSPECIFIED")));
}

TEST(LayoutValidationTest, UnknownEnumValues) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4}, {1}, {R()}, {}, static_cast<v1::DType>(99));
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("dtype 99")));
  v1::Side op = MakeSide(2);
  AddMesh(&op, "p", {4}, {2}, {P(static_cast<v1::ReduceOp>(7))});
  EXPECT_THAT(Error(op), AllOf(HasSubstr("tensor \"p\""), HasSubstr("unknown op 7")));
  v1::Side frag = MakeSide(2);
  v1::Fragment* f = AddFragment(AddTensor(&frag, "f", {4}), 1, B({0}, {4}));
  f->set_partial_group(1);
  f->set_partial_op(static_cast<v1::ReduceOp>(7));
  EXPECT_THAT(Error(frag), AllOf(HasSubstr("tensor \"f\""), HasSubstr("rank 1"),
                                 HasSubstr("unknown partial_op 7")));
}

TEST(LayoutValidationTest, NegativeShape) {
  v1::Side side = MakeSide(1);
  AddMesh(&side, "w", {4, -1}, {1}, {R()});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("negative dim 1")));
}

TEST(LayoutValidationTest, NoLayout) {
  v1::Side side = MakeSide(1);
  AddTensor(&side, "w", {4});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("no layout")));
}

TEST(LayoutValidationTest, MeshProductMismatch) {
  v1::Side side = MakeSide(4);
  AddMesh(&side, "w", {4}, {2, 2}, {S(0), R()}, {0, 1, 2});
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("needs 4 ranks"), HasSubstr("lists 3")));
}

TEST(LayoutValidationTest, PlacementCountMismatch) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4}, {2}, {S(0), R()}, {0, 1});
  EXPECT_THAT(Error(side), HasSubstr("2 placements"));
}

TEST(LayoutValidationTest, MeshRankOutOfRange) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4}, {2}, {S(0)}, {0, 5});
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("rank 5"), HasSubstr("out of range")));
}

TEST(LayoutValidationTest, MeshRankTwice) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4}, {2}, {S(0)}, {1, 1});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("rank 1 appears twice")));
}

TEST(LayoutValidationTest, PlacementDimOutOfRange) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4, 4}, {2}, {S(2)});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("Shard(2)"),
                                 HasSubstr("dim out of range")));
  v1::Side neg = MakeSide(2);
  AddMesh(&neg, "v", {4}, {2}, {SS(-1, 2)});
  EXPECT_THAT(Error(neg), AllOf(HasSubstr("tensor \"v\""), HasSubstr("dim out of range")));
}

TEST(LayoutValidationTest, SplitFactorBelowOne) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4}, {2}, {SS(0, 0)});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("split_factor")));
}

TEST(LayoutValidationTest, UnsetPlacement) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "w", {4}, {2}, {v1::Placement()});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("no kind")));
}

TEST(LayoutValidationTest, PartialOpsDisagree) {
  v1::Side side = MakeSide(4);
  AddMesh(&side, "w", {4}, {2, 2}, {P(v1::REDUCE_SUM), P(v1::REDUCE_AVG)});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("disagree")));
}

TEST(LayoutValidationTest, FragmentRankOutOfRange) {
  v1::Side side = MakeSide(2);
  AddFragment(AddTensor(&side, "w", {4}), 2, B({0}, {4}));
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("rank 2"), HasSubstr("out of range")));
}

TEST(LayoutValidationTest, BoxOutOfTensor) {
  v1::Side side = MakeSide(2);
  AddFragment(AddTensor(&side, "w", {4, 4}), 1, B({2, 0}, {3, 4}));
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("rank 1"),
                                 HasSubstr("[2:5, 0:4]"), HasSubstr("outside shape [4, 4]")));
}

TEST(LayoutValidationTest, BoxWrongRank) {
  v1::Side side = MakeSide(1);
  AddFragment(AddTensor(&side, "w", {4, 4}), 0, B({0}, {4}));
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("rank 0"), HasSubstr("has 2 dims")));
}

TEST(LayoutValidationTest, NegativeOffsetOrLength) {
  v1::Side side = MakeSide(1);
  AddFragment(AddTensor(&side, "w", {4}), 0, B({-1}, {2}));
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("offset -1")));
  v1::Side len = MakeSide(1);
  AddFragment(AddTensor(&len, "v", {4}), 0, B({1}, {-1}));
  EXPECT_THAT(Error(len), AllOf(HasSubstr("tensor \"v\""), HasSubstr("length -1")));
  v1::Side off = MakeSide(1);
  AddFragment(AddTensor(&off, "u", {4}), 0, B({0}, {4}), "", -8);
  EXPECT_THAT(Error(off), AllOf(HasSubstr("tensor \"u\""), HasSubstr("negative byte_offset")));
}

TEST(LayoutValidationTest, StridesCountMismatch) {
  v1::Side side = MakeSide(1);
  AddFragment(AddTensor(&side, "w", {4, 4}), 0, B({0, 0}, {4, 4}), "", 0, {4});
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("[0:4, 0:4]"), HasSubstr("1 strides")));
}

TEST(LayoutValidationTest, SelfAliasingStrides) {
  v1::Side side = MakeSide(1);
  AddFragment(AddTensor(&side, "w", {4, 4}), 0, B({0, 0}, {4, 4}), "", 0, {2, 1});
  EXPECT_THAT(Error(side), AllOf(HasSubstr("tensor \"w\""), HasSubstr("same address")));
}

TEST(LayoutValidationTest, ByteRangesOverlapOnOneRank) {
  v1::Side side = MakeSide(2);
  v1::TensorLayout* t = AddTensor(&side, "w", {8});
  AddFragment(t, 1, B({0}, {4}), "buf", 0);
  AddFragment(t, 1, B({4}, {4}), "buf", 8);  // bytes [8, 24) overlap [0, 16)
  EXPECT_THAT(Error(side), AllOf(HasSubstr("rank 1"), HasSubstr("\"buf\""), HasSubstr("\"w\""),
                                 HasSubstr("[0:4]"), HasSubstr("[4:8]")));
  // The same fragments on different ranks do not collide.
  t->mutable_fragments()->mutable_fragments(1)->set_rank(0);
  EXPECT_EQ(Error(side), "");
}

TEST(LayoutValidationTest, InterleavedColumnsThatCollide) {
  v1::Side side = MakeSide(1);
  v1::TensorLayout* t = AddTensor(&side, "w", {4, 6});
  AddFragment(t, 0, B({0, 0}, {4, 3}), "flat", 0, {6, 1});
  AddFragment(t, 0, B({0, 3}, {4, 3}), "flat", 2 * 4, {6, 1});  // starts at column 2
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("rank 0"), HasSubstr("[0:4, 0:3]"), HasSubstr("[0:4, 3:6]")));
}

TEST(LayoutValidationTest, TwoMeshTensorsInOneBuffer) {
  v1::Side side = MakeSide(2);
  AddMesh(&side, "a", {4}, {2}, {S(0)})->mutable_mesh()->set_buffer("shared");
  AddMesh(&side, "b", {4}, {2}, {S(0)})->mutable_mesh()->set_buffer("shared");
  EXPECT_THAT(Error(side, SideRole::kDestination),
              AllOf(HasSubstr("\"shared\""), HasSubstr("\"a\""), HasSubstr("\"b\"")));
}

TEST(LayoutValidationTest, DestinationOverlappingBoxes) {
  v1::Side side = MakeSide(2, "dst");
  v1::TensorLayout* t = AddTensor(&side, "w", {8, 8});
  AddFragment(t, 1, B({0, 0}, {4, 8}), "a");
  AddFragment(t, 1, B({3, 2}, {2, 2}), "b");
  EXPECT_THAT(Error(side, SideRole::kDestination),
              AllOf(HasSubstr("\"dst\""), HasSubstr("tensor \"w\""), HasSubstr("rank 1"),
                    HasSubstr("[0:4, 0:8]"), HasSubstr("[3:5, 2:4]")));
  // A source may hold one element twice (e.g. in two buffers).
  EXPECT_EQ(Error(side, SideRole::kSource), "");
}

TEST(LayoutValidationTest, DestinationRejectsPartial) {
  v1::Side side = MakeSide(2, "dst");
  AddMesh(&side, "w", {4}, {2}, {P()});
  EXPECT_THAT(Error(side, SideRole::kDestination),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("partial")));
  EXPECT_EQ(Error(side, SideRole::kSource), "");

  v1::Side explicit_side = MakeSide(2, "dst");
  AddFragment(AddTensor(&explicit_side, "v", {4}), 1, B({0}, {4}))->set_partial_group(1);
  EXPECT_THAT(Error(explicit_side, SideRole::kDestination),
              AllOf(HasSubstr("tensor \"v\""), HasSubstr("rank 1"), HasSubstr("partial_group")));
}

TEST(LayoutValidationTest, PartialGroupMustShareBox) {
  v1::Side side = MakeSide(2);
  v1::TensorLayout* t = AddTensor(&side, "w", {4});
  AddFragment(t, 0, B({0}, {4}))->set_partial_group(1);
  AddFragment(t, 1, B({0}, {2}))->set_partial_group(1);
  EXPECT_THAT(Error(side),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("rank 1"), HasSubstr("partial_group 1")));
}

TEST(LayoutValidationTest, MeshLocalIntervalsRejectsBadCoordinate) {
  EXPECT_FALSE(MeshLocalIntervals({4}, {2}, {2}, {S(0)}).ok());
  EXPECT_FALSE(MeshLocalIntervals({4}, {2}, {0}, {S(1)}).ok());
  EXPECT_FALSE(MeshLocalIntervals({4}, {2, 2}, {0}, {S(0)}).ok());
}

}  // namespace
}  // namespace wsync::plan
