// Stage 9's piece fields (plan_emit_pieces.h): a piece side owns its shape
// through copies, and the run grouper joins pieces whose views are alike but
// for their stepped fields.
#include "controller/plan/plan_emit_pieces.h"

#include <vector>

#include "gtest/gtest.h"

namespace wsync::plan::planner_detail {
namespace {

constexpr int64_t kStrides[2] = {64, 1};

ViewFields View(int32_t buffer, int64_t byte, const int64_t* shape, v1::BufferSide side) {
  ViewFields v;
  v.buffer_name = buffer;
  v.byte_offset = byte;
  v.rank = 2;
  v.shape = shape;
  v.strides = kStrides;
  v.dtype = v1::BF16;
  v.side = side;
  return v;
}

TEST(PieceFieldsTest, ASidesShapeIsItsOwnThroughCopies) {
  int64_t shape[2] = {4, 64};
  OwnedViewFields a;
  a.Set(View(3, 128, shape, v1::SOURCE_BUFFER));
  shape[0] = 99;  // the caller's array is not kept
  EXPECT_EQ(a.fields().shape[0], 4);
  EXPECT_EQ(a.fields().strides, kStrides);
  std::vector<OwnedViewFields> sides(1, a);
  sides.resize(64);  // moves the first elsewhere
  OwnedViewFields b;
  b = sides[0];
  for (const OwnedViewFields* s : {&sides[0], &b}) {
    EXPECT_NE(s->fields().shape, a.fields().shape) << "a copy points at its own shape";
    EXPECT_EQ(s->fields().shape[0], 4);
    EXPECT_EQ(s->fields().shape[1], 64);
    EXPECT_EQ(s->fields().buffer_name, 3);
    EXPECT_EQ(s->fields().byte_offset, 128);
  }
  a.Set(View(5, 0, shape, v1::DESTINATION_BUFFER));
  EXPECT_EQ(b.fields().shape[0], 4) << "a copy does not change with its original";
  EXPECT_EQ(b.fields().side, v1::SOURCE_BUFFER);
}

// Piece k of a stepped sequence: buffers and byte offsets step, the shape is
// the same (each piece's shape in its own array).
PieceFields Stepped(int k, bool relay) {
  int64_t shape[2] = {1, 64};
  PieceFields f;
  f.tensor_name = 10 + k;
  f.bucket_offset = 128 * k;
  f.src.Set(View(k, 256 * k, shape, relay ? v1::DESTINATION_BUFFER : v1::SOURCE_BUFFER));
  f.dst.Set(View(100 + k, 512 * k, shape, v1::DESTINATION_BUFFER));
  f.wire = v1::BF16;
  f.wire_bytes = 128;
  return f;
}

TEST(PieceFieldsTest, PiecesAlikeButForTheSteppedFieldsFormOneRun) {
  // 0-3 step alike; 4 continues the steps but reads the destination side (a
  // relay): it starts a run of its own, dropped at one member.
  std::vector<PieceFields> pieces;
  for (int k = 0; k < 5; ++k) pieces.push_back(Stepped(k, /*relay=*/k == 4));
  EXPECT_FALSE(pieces[3].relay());
  EXPECT_TRUE(pieces[4].relay());
  RunGrouper g;
  g.Reset(5);
  for (int k = 0; k < 5; ++k) g.Add(k, /*role=*/1, &pieces[k]);
  g.Finish();
  ASSERT_EQ(g.runs().size(), 1u);
  EXPECT_EQ(g.runs()[0].first, 0);
  EXPECT_EQ(g.runs()[0].count, 4);
  const int64_t steps[6] = {1, 1, 1, 256, 512, 128};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(g.runs()[0].step[i], steps[i]) << "step " << i;
  EXPECT_EQ(g.run_of(4), -1);
}

}  // namespace
}  // namespace wsync::plan::planner_detail
