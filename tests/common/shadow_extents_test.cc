#include "common/shadow_extents.h"

#include "gtest/gtest.h"

namespace wsync {
namespace {

v1::TensorView View(int32_t name, int64_t offset, std::vector<int64_t> shape,
                    std::vector<int64_t> strides, v1::BufferSide side) {
  v1::TensorView v;
  v.set_buffer_name(name);
  v.set_byte_offset(offset);
  for (int64_t s : shape) v.add_shape(s);
  for (int64_t s : strides) v.add_strides(s);
  v.set_dtype(v1::FP32);
  v.set_side(side);
  return v;
}

// Worker 1 receives two pieces of "inference/w" (one strided) and one of
// "inference/b"; worker 2 a reduce into "inference/w"; worker 0 only sends.
v1::Plan TwoReceivers() {
  v1::Plan plan;
  plan.add_names("trainer/w");
  plan.add_names("inference/w");
  plan.add_names("inference/b");
  v1::Bucket* b = plan.add_buckets();
  b->set_sender(0);
  b->set_receiver(1);
  v1::Piece* p = b->add_pieces();
  *p->mutable_src() = View(0, 0, {4}, {1}, v1::SOURCE_BUFFER);
  *p->mutable_dst() = View(1, 64, {4}, {1}, v1::DESTINATION_BUFFER);  // ends at 80
  p = b->add_pieces();
  *p->mutable_dst() = View(1, 0, {2, 3}, {10, 1}, v1::DESTINATION_BUFFER);  // ends at 4*(13)+4=56
  p = b->add_pieces();
  *p->mutable_dst() = View(2, 0, {5}, {1}, v1::DESTINATION_BUFFER);  // 20
  p = b->add_pieces();  // a reduce input: not written by itself
  p->set_reduce_id(1);
  *p->mutable_dst() = View(2, 400, {5}, {1}, v1::DESTINATION_BUFFER);
  v1::Reduce* r = plan.add_reduces();
  r->set_worker(2);
  *r->mutable_dst() = View(1, 100, {0}, {1}, v1::DESTINATION_BUFFER);  // empty: 0
  r = plan.add_reduces();
  r->set_worker(2);
  *r->mutable_dst() = View(1, 8, {3}, {2}, v1::DESTINATION_BUFFER);  // 8 + 4*5 = 28
  return plan;
}

TEST(ShadowExtentsTest, HighestByteWrittenPerDestinationBuffer) {
  const v1::Plan plan = TwoReceivers();
  auto one = ShadowExtents(plan, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, (std::map<std::string, int64_t>{{"inference/w", 80}, {"inference/b", 20}}));
  auto two = ShadowExtents(plan, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::map<std::string, int64_t>{{"inference/w", 28}}));
  auto sender = ShadowExtents(plan, 0);
  ASSERT_TRUE(sender.ok());
  EXPECT_TRUE(sender->empty());
  auto all = ShadowBytesByWorker(plan);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::map<int32_t, int64_t>{{1, 100}, {2, 28}}));
  EXPECT_EQ(*ShadowBytes(plan, 1), 100);
}

// Review finding (issue 20): a receiver whose views are all empty stages on
// neither side (the controller listed it with 0 bytes, the worker staged).
TEST(ShadowExtentsTest, AReceiverWhoseViewsAreAllEmptyDoesNotStage) {
  v1::Plan plan;
  plan.add_names("trainer/w");
  plan.add_names("inference/w");
  v1::Bucket* b = plan.add_buckets();
  b->set_sender(0);
  b->set_receiver(1);
  for (int64_t offset : {0, 40}) {
    v1::Piece* p = b->add_pieces();
    *p->mutable_src() = View(0, 0, {0}, {1}, v1::SOURCE_BUFFER);
    *p->mutable_dst() = View(1, offset, {3, 0}, {1, 1}, v1::DESTINATION_BUFFER);
  }
  auto extents = ShadowExtents(plan, 1);
  ASSERT_TRUE(extents.ok());
  EXPECT_EQ(*extents, (std::map<std::string, int64_t>{{"inference/w", 0}}));
  EXPECT_FALSE(StagesShadow(*extents));
  auto by_worker = ShadowBytesByWorker(plan);
  ASSERT_TRUE(by_worker.ok());
  EXPECT_TRUE(by_worker->empty()) << "not listed: the controller expects no staged report";
  auto writes = ShadowWrites(plan, 1);
  ASSERT_TRUE(writes.ok());
  EXPECT_TRUE(writes->empty());
}

TEST(ShadowExtentsTest, WritesListTheNonEmptyViewsOfEachBuffer) {
  const v1::Plan plan = TwoReceivers();
  auto one = ShadowWrites(plan, 1);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 2u);
  EXPECT_EQ(one->at("inference/w").extent, 80);
  EXPECT_EQ(one->at("inference/w").views.size(), 2u);
  EXPECT_EQ(one->at("inference/b").views.size(), 1u);
  auto two = ShadowWrites(plan, 2);
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 1u);
  ASSERT_EQ(two->at("inference/w").views.size(), 1u) << "the empty reduce is left out";
  EXPECT_EQ(two->at("inference/w").views[0].byte_offset(), 8);
}

// Piece runs (common/plan_pieces.h) count member by member: worker 1's
// "inference/b" gets 3 more members of 5 floats at a stride of 1000 bytes
// (the last ends at 2020), packed after the bucket's 4 plain pieces.
TEST(ShadowExtentsTest, EveryMemberOfARunCounts) {
  v1::Plan plan = TwoReceivers();
  v1::Bucket* b = plan.mutable_buckets(0);
  b->set_bytes(4096);
  v1::PieceRun* run = b->add_runs();
  v1::Piece* f = run->mutable_first();
  *f->mutable_src() = View(0, 0, {5}, {1}, v1::SOURCE_BUFFER);
  *f->mutable_dst() = View(2, 0, {5}, {1}, v1::DESTINATION_BUFFER);
  f->set_wire_dtype(v1::FP32);
  f->set_bucket_offset(1024);
  run->set_count(3);
  run->set_dst_byte_step(1000);
  run->set_bucket_step(20);
  auto one = ShadowExtents(plan, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, (std::map<std::string, int64_t>{{"inference/w", 80}, {"inference/b", 2020}}));
  auto writes = ShadowWrites(plan, 1);
  ASSERT_TRUE(writes.ok()) << writes.status();
  EXPECT_EQ(writes->at("inference/b").views.size(), 4u);
  EXPECT_EQ(*ShadowBytesByWorker(plan), (std::map<int32_t, int64_t>{{1, 2100}, {2, 28}}));
  run->set_dst_buffer_step(5);  // the last member names no buffer
  const absl::Status s = ShadowExtents(plan, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("run 0"), std::string::npos) << s;
}

// Rows of a run count member by member, with and without the views, and
// an empty run view names its buffers with extent 0.
TEST(ShadowExtentsTest, EveryRowOfARunCounts) {
  v1::Plan plan = TwoReceivers();
  plan.add_names("inference/c");  // 3
  v1::Bucket* b = plan.mutable_buckets(0);
  b->set_bytes(4096);
  v1::PieceRun* run = b->add_runs();
  v1::Piece* f = run->mutable_first();
  *f->mutable_src() = View(0, 0, {5}, {1}, v1::SOURCE_BUFFER);
  *f->mutable_dst() = View(2, 0, {5}, {1}, v1::DESTINATION_BUFFER);
  f->set_wire_dtype(v1::FP32);
  f->set_bucket_offset(1024);
  run->set_count(2);
  run->set_dst_byte_step(100);
  run->set_bucket_step(20);
  run->set_outer_count(2);
  run->set_outer_dst_buffer_step(1);  // row 1 writes inference/c
  run->set_outer_dst_byte_step(1000);
  run->set_outer_bucket_step(40);
  const std::map<std::string, int64_t> want = {
      {"inference/w", 80}, {"inference/b", 120}, {"inference/c", 1120}};
  EXPECT_EQ(*ShadowExtents(plan, 1), want);
  auto writes = ShadowWrites(plan, 1);
  ASSERT_TRUE(writes.ok()) << writes.status();
  EXPECT_EQ(writes->at("inference/c").views.size(), 2u);
  EXPECT_EQ(writes->at("inference/c").extent, 1120);
  EXPECT_EQ(*ShadowBytesByWorker(plan), (std::map<int32_t, int64_t>{{1, 1320}, {2, 28}}));
  f->mutable_dst()->set_shape(0, 0);
  f->mutable_src()->set_shape(0, 0);
  EXPECT_EQ(ShadowExtents(plan, 1)->at("inference/c"), 0);
}

// Run members are bounded per receiving worker (what it binds), not per
// plan: two receivers of 3 M members each pass, one receiver of 6 M fails.
TEST(ShadowExtentsTest, RunMembersAreBoundedPerReceiver) {
  v1::Plan plan;
  plan.add_names("inference/w");
  for (int32_t receiver : {1, 2}) {
    v1::Bucket* b = plan.add_buckets();
    b->set_id(receiver);
    b->set_sender(0);
    b->set_receiver(receiver);
    v1::PieceRun* run = b->add_runs();
    v1::Piece* f = run->mutable_first();
    *f->mutable_src() = View(0, 0, {0}, {1}, v1::SOURCE_BUFFER);
    *f->mutable_dst() = View(0, 0, {0}, {1}, v1::DESTINATION_BUFFER);
    f->set_wire_dtype(v1::FP32);
    run->set_count(1500);
    run->set_outer_count(2000);  // 3 M members of 0 bytes
  }
  auto by_worker = ShadowBytesByWorker(plan);
  ASSERT_TRUE(by_worker.ok()) << by_worker.status();
  EXPECT_TRUE(by_worker->empty());  // nothing written: nobody stages
  plan.mutable_buckets(1)->set_receiver(1);
  const absl::Status s = ShadowBytesByWorker(plan).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("worker 1 receives"), std::string::npos) << s;
}

TEST(ShadowExtentsTest, RefusesBadViewsNamingTheBuffer) {
  v1::Plan plan = TwoReceivers();
  plan.mutable_buckets(0)->mutable_pieces(0)->mutable_dst()->set_buffer_name(9);
  EXPECT_EQ(ShadowExtents(plan, 1).status().code(), absl::StatusCode::kInvalidArgument);
  plan = TwoReceivers();
  plan.mutable_buckets(0)->mutable_pieces(0)->mutable_dst()->set_shape(0, int64_t{1} << 60);
  auto s = ShadowExtents(plan, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inference/w"), std::string::npos) << s;
}

// Shapes and strides each within the per-value bound whose products are
// not: (2^33 - 1) * 2^31 wraps int64 to a negative element offset, which the
// unchecked sum took for a small extent; and sums of several such dims.
TEST(ShadowExtentsTest, RefusesViewsWhoseShapeTimesStrideOverflows) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> hostile = {
      {{int64_t{1} << 33, 1}, {int64_t{1} << 31, 1}},
      {{int64_t{1} << 40, int64_t{1} << 40}, {int64_t{1} << 20, 1}},
      {{3, int64_t{1} << 55}, {int64_t{1} << 55, 1}},
      {{(int64_t{1} << 56), 2}, {int64_t{1} << 56, 1}},
  };
  for (const auto& [shape, strides] : hostile) {
    v1::Plan plan = TwoReceivers();
    *plan.mutable_buckets(0)->mutable_pieces(1)->mutable_dst() =
        View(1, 0, shape, strides, v1::DESTINATION_BUFFER);
    const absl::Status s = ShadowExtents(plan, 1).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << "shape " << shape[0] << "x" << shape[1] << ", strides " << strides[0] << ": " << s;
    EXPECT_NE(s.message().find("inference/w"), std::string::npos) << s;
    EXPECT_NE(s.message().find("overflows"), std::string::npos) << s;
    EXPECT_EQ(ShadowWrites(plan, 1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ShadowBytesByWorker(plan).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // The largest view the bound admits still counts exactly.
  v1::Plan plan = TwoReceivers();
  *plan.mutable_buckets(0)->mutable_pieces(1)->mutable_dst() =
      View(1, 0, {2, int64_t{1} << 20}, {int64_t{1} << 30, 1}, v1::DESTINATION_BUFFER);
  auto extents = ShadowExtents(plan, 1);
  ASSERT_TRUE(extents.ok()) << extents.status();
  EXPECT_EQ(extents->at("inference/w"), ((int64_t{1} << 30) + (int64_t{1} << 20)) * 4);
}

}  // namespace
}  // namespace wsync
