// common/plan_pieces.h: a bucket's runs expand to exactly the pieces they
// stand for, and hostile runs are refused naming the bucket and run.
#include "common/plan_pieces.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

v1::Piece Plain(int32_t tensor, int32_t src_buf, int64_t src_off, int32_t dst_buf, int64_t dst_off,
                int64_t bucket_off) {
  v1::Piece p;
  p.set_tensor_name(tensor);
  p.set_wire_dtype(v1::BF16);
  p.set_bucket_offset(bucket_off);
  for (v1::TensorView* v : {p.mutable_src(), p.mutable_dst()}) {
    v->add_shape(8);
    v->add_shape(64);
    v->add_strides(64);
    v->add_strides(1);
    v->set_dtype(v1::BF16);
  }
  p.mutable_src()->set_buffer_name(src_buf);
  p.mutable_src()->set_byte_offset(src_off);
  p.mutable_dst()->set_buffer_name(dst_buf);
  p.mutable_dst()->set_byte_offset(dst_off);
  p.mutable_dst()->set_side(v1::DESTINATION_BUFFER);
  return p;
}

constexpr int64_t kMember = 8 * 64 * 2;  // one member's wire bytes

// Two plain pieces, then 3 experts of one layer: tensors 10, 11, 12 (their
// own source buffers 20, 21, 22 at offset 0) into one stacked buffer 30 at
// a stride of 4096 bytes.
v1::Bucket ExpertBucket() {
  v1::Bucket b;
  b.set_id(7);
  b.set_bytes(5 * kMember);
  *b.add_pieces() = Plain(1, 2, 0, 3, 0, 0);
  *b.add_pieces() = Plain(4, 5, 128, 6, 256, kMember);
  v1::PieceRun* run = b.add_runs();
  *run->mutable_first() = Plain(10, 20, 0, 30, 4096, 2 * kMember);
  run->set_count(3);
  run->set_tensor_name_step(1);
  run->set_src_buffer_step(1);
  run->set_dst_byte_step(4096);
  run->set_bucket_step(kMember);
  return b;
}

std::vector<v1::Piece> Expand(const v1::Bucket& b) {
  std::vector<v1::Piece> out;
  EXPECT_TRUE(ForEachPiece(b, [&](int64_t i, const v1::Piece& p) {
                EXPECT_EQ(i, static_cast<int64_t>(out.size()));
                out.push_back(p);
                return absl::OkStatus();
              }).ok());
  return out;
}

TEST(PlanPiecesTest, ARunExpandsToThePiecesItStandsFor) {
  const v1::Bucket b = ExpertBucket();
  ASSERT_TRUE(CheckPieceRuns(b, 40).ok()) << CheckPieceRuns(b, 40);
  EXPECT_EQ(*PieceCount(b), 5);
  const std::vector<v1::Piece> got = Expand(b);
  const std::vector<v1::Piece> want = {Plain(1, 2, 0, 3, 0, 0), Plain(4, 5, 128, 6, 256, kMember),
                                       Plain(10, 20, 0, 30, 4096, 2 * kMember),
                                       Plain(11, 21, 0, 30, 8192, 3 * kMember),
                                       Plain(12, 22, 0, 30, 12288, 4 * kMember)};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].SerializeAsString(), want[i].SerializeAsString()) << "piece " << i;
  }
}

TEST(PlanPiecesTest, AnErrorFromTheCallerStopsTheWalk) {
  int calls = 0;
  absl::Status s = ForEachPiece(ExpertBucket(), [&](int64_t i, const v1::Piece&) {
    ++calls;
    return i == 3 ? absl::InvalidArgumentError("member 1 refused") : absl::OkStatus();
  });
  EXPECT_EQ(s.message(), "member 1 refused");
  EXPECT_EQ(calls, 4);
}

// Each hostile run is refused, naming the bucket, the run and what is wrong.
TEST(PlanPiecesTest, HostileRunsAreRefusedNamingBucketAndRun) {
  struct Case {
    const char* what;
    void (*edit)(v1::PieceRun*);
    const char* message;
  };
  const Case cases[] = {
      {"one member", [](v1::PieceRun* r) { r->set_count(1); }, "at least 2 members"},
      {"negative count", [](v1::PieceRun* r) { r->set_count(-5); }, "at least 2 members"},
      {"a reduce input", [](v1::PieceRun* r) { r->mutable_first()->set_reduce_id(3); },
       "reduce or quantize input"},
      {"sender quantization", [](v1::PieceRun* r) { r->mutable_first()->add_quant_block(128); },
       "quantized at the sender"},
      {"last tensor name past the names", [](v1::PieceRun* r) { r->set_tensor_name_step(20); },
       "tensor_name of a member is 50"},
      {"a name below 0", [](v1::PieceRun* r) { r->set_dst_buffer_step(-20); },
       "dst.buffer_name of a member is -10"},
      {"byte offset overflows",
       [](v1::PieceRun* r) { r->set_src_byte_step(std::numeric_limits<int64_t>::max() / 2 + 1); },
       "src.byte_offset"},
      {"negative byte offset", [](v1::PieceRun* r) { r->set_dst_byte_step(-4096); },
       "dst.byte_offset of a member is -4096"},
      {"overlapping members", [](v1::PieceRun* r) { r->set_bucket_step(kMember - 2); },
       "members would overlap"},
      {"past the bucket", [](v1::PieceRun* r) { r->set_count(4); }, "the last member's bytes"},
      {"huge count", [](v1::PieceRun* r) { r->set_count(std::numeric_limits<int32_t>::max()); },
       "tensor_name of a member"},
      {"no wire dtype",
       [](v1::PieceRun* r) { r->mutable_first()->set_wire_dtype(v1::DTYPE_UNSPECIFIED); },
       "no wire dtype"},
  };
  for (const Case& c : cases) {
    v1::Bucket b = ExpertBucket();
    c.edit(b.mutable_runs(0));
    const absl::Status s = CheckPieceRuns(b, 40);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("bucket 7 run 0")) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what << ": " << s;
  }
}

TEST(PlanPiecesTest, PieceCountRefusesANegativeRun) {
  v1::Bucket b = ExpertBucket();
  b.mutable_runs(0)->set_count(-1);
  EXPECT_EQ(PieceCount(b).status().code(), absl::StatusCode::kInvalidArgument);
}

// A plan of 40 names ("n0".."n39") holding ExpertBucket and a copy of it.
v1::Plan TwoBucketPlan() {
  v1::Plan plan;
  for (int i = 0; i < 40; ++i) plan.add_names("n" + std::to_string(i));
  *plan.add_buckets() = ExpertBucket();
  *plan.add_buckets() = ExpertBucket();
  plan.mutable_buckets(1)->set_id(8);
  return plan;
}

// The plan-wide budget: a run is a few bytes whatever its count, so the
// members of all runs together are bounded before anyone walks them.
TEST(PlanPiecesTest, CheckPlanRunsBoundsTheMembersOfAllRuns) {
  v1::Plan plan = TwoBucketPlan();
  EXPECT_TRUE(CheckPlanRuns(plan).ok()) << CheckPlanRuns(plan);
  EXPECT_TRUE(CheckPlanRuns(plan, 6).ok());
  absl::Status s = CheckPlanRuns(plan, 5);  // 3 + 3 members
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("bucket 8 run 0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than 5 pieces"));
  // A count of 2^31 - 1 that every per-run check would let through (steps
  // of 0, members of 0 bytes) is refused by the default budget.
  v1::PieceRun* r = plan.mutable_buckets(0)->mutable_runs(0);
  r->set_count(std::numeric_limits<int32_t>::max());
  r->set_tensor_name_step(0);
  r->set_src_buffer_step(0);
  r->set_dst_byte_step(0);
  r->set_bucket_step(0);
  r->mutable_first()->mutable_dst()->set_shape(0, 0);
  r->mutable_first()->mutable_src()->set_shape(0, 0);
  EXPECT_TRUE(CheckPieceRuns(plan.buckets(0), 40).ok());
  s = CheckPlanRuns(plan);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bucket 7 run 0")) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than 4194304 pieces")) << s;
  // And a run refused on its own is refused through the plan too.
  plan = TwoBucketPlan();
  plan.mutable_buckets(1)->mutable_runs(0)->set_count(1);
  EXPECT_THAT(std::string(CheckPlanRuns(plan).message()), HasSubstr("bucket 8 run 0: count 1"));
}

// Rows of runs (outer_count): 2 layers x 3 experts. Row j is layer j's
// stacked buffer (names 30 and 31); member k of a row the expert slot k.
v1::Bucket RowsBucket() {
  v1::Bucket b;
  b.set_id(9);
  b.set_bytes(6 * kMember);
  v1::PieceRun* run = b.add_runs();
  *run->mutable_first() = Plain(10, 20, 0, 30, 0, 0);
  run->set_count(3);
  run->set_tensor_name_step(1);
  run->set_src_buffer_step(1);
  run->set_dst_byte_step(4096);
  run->set_bucket_step(kMember);
  run->set_outer_count(2);
  run->set_outer_tensor_name_step(3);
  run->set_outer_src_buffer_step(3);
  run->set_outer_dst_buffer_step(1);
  run->set_outer_bucket_step(3 * kMember);
  return b;
}

TEST(PlanPiecesTest, RowsOfARunExpandRowByRow) {
  const v1::Bucket b = RowsBucket();
  ASSERT_TRUE(CheckPieceRuns(b, 40).ok()) << CheckPieceRuns(b, 40);
  EXPECT_EQ(*PieceCount(b), 6);
  const std::vector<v1::Piece> got = Expand(b);
  ASSERT_EQ(got.size(), 6u);
  for (int j = 0; j < 2; ++j) {
    for (int k = 0; k < 3; ++k) {
      const v1::Piece want = Plain(10 + 3 * j + k, 20 + 3 * j + k, 0, 30 + j, 4096 * k,
                                   (3 * j + k) * kMember);
      EXPECT_EQ(got[3 * j + k].SerializeAsString(), want.SerializeAsString())
          << "row " << j << " member " << k;
    }
  }
  v1::Plan plan;
  for (int i = 0; i < 40; ++i) plan.add_names("n" + std::to_string(i));
  *plan.add_buckets() = b;
  EXPECT_TRUE(CheckPlanRuns(plan, 6).ok());
  EXPECT_THAT(std::string(CheckPlanRuns(plan, 5).message()), HasSubstr("more than 5 pieces"));
}

TEST(PlanPiecesTest, HostileRowsAreRefusedNamingBucketAndRun) {
  struct Case {
    const char* what;
    void (*edit)(v1::PieceRun*);
    const char* message;
  };
  const Case cases[] = {
      {"one row", [](v1::PieceRun* r) { r->set_outer_count(1); }, "outer_count 1"},
      {"negative rows", [](v1::PieceRun* r) { r->set_outer_count(-3); }, "outer_count -3"},
      {"last row's names past the names",
       [](v1::PieceRun* r) { r->set_outer_tensor_name_step(30); }, "tensor_name of a member is"},
      {"a row's buffer below 0", [](v1::PieceRun* r) { r->set_outer_dst_buffer_step(-31); },
       "dst.buffer_name of a member is -1"},
      {"a row's byte offset overflows",
       [](v1::PieceRun* r) {
         r->set_outer_src_byte_step(std::numeric_limits<int64_t>::max() / 2 + 1);
         r->set_outer_count(3);
       },
       "src.byte_offset"},
      {"negative offset in the last row, first member",
       [](v1::PieceRun* r) {
         r->set_outer_dst_byte_step(-8192);
         r->set_dst_byte_step(8192);
       },
       "dst.byte_offset of a member is -8192"},
      {"overlapping rows", [](v1::PieceRun* r) { r->set_outer_bucket_step(2 * kMember); },
       "rows would overlap"},
      {"rows past the bucket", [](v1::PieceRun* r) { r->set_outer_count(3); },
       "the last member's bytes"},
      {"huge rows",
       [](v1::PieceRun* r) { r->set_outer_count(std::numeric_limits<int32_t>::max()); },
       "tensor_name of a member"},
  };
  for (const Case& c : cases) {
    v1::Bucket b = RowsBucket();
    c.edit(b.mutable_runs(0));
    const absl::Status s = CheckPieceRuns(b, 40);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("bucket 9 run 0")) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what << ": " << s;
  }
  // Rows of 2^31 - 1 runs of 2^31 - 1 members (every step 0, members of 0
  // bytes) are ~2^62 members each: refused by the plan-wide budget, and three
  // of them (over 2^63) refused even by a budget of 2^63 - 1, not overflowed.
  v1::Plan plan;
  plan.add_names("n");
  v1::Bucket& b = *plan.add_buckets();
  b = RowsBucket();
  v1::PieceRun* r = b.mutable_runs(0);
  *r->mutable_first() = Plain(0, 0, 0, 0, 0, 0);
  r->mutable_first()->mutable_dst()->set_shape(0, 0);
  for (int i = 0; i < 3; ++i) {
    v1::PieceRun* run = i == 0 ? r : b.add_runs();
    if (i > 0) *run = *r;
    run->set_count(std::numeric_limits<int32_t>::max());
    run->set_outer_count(std::numeric_limits<int32_t>::max());
    run->set_tensor_name_step(0);
    run->set_src_buffer_step(0);
    run->set_dst_byte_step(0);
    run->set_bucket_step(0);
    run->set_outer_tensor_name_step(0);
    run->set_outer_src_buffer_step(0);
    run->set_outer_dst_buffer_step(0);
    run->set_outer_bucket_step(0);
  }
  EXPECT_TRUE(CheckPieceRuns(b, 1).ok()) << CheckPieceRuns(b, 1);
  EXPECT_THAT(std::string(CheckPlanRuns(plan).message()), HasSubstr("more than 4194304 pieces"));
  EXPECT_THAT(std::string(CheckPlanRuns(plan, std::numeric_limits<int64_t>::max()).message()),
              HasSubstr("bucket 9 run 2"));
  EXPECT_EQ(PieceCount(b).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanPiecesTest, ExpandPlanRunsWritesOutEveryBucket) {
  const v1::Plan plan = TwoBucketPlan();
  EXPECT_TRUE(HasPieceRuns(plan));
  const v1::Plan out = ExpandPlanRuns(plan);
  EXPECT_FALSE(HasPieceRuns(out));
  ASSERT_EQ(out.buckets_size(), 2);
  for (const v1::Bucket& b : out.buckets()) {
    EXPECT_EQ(b.runs_size(), 0);
    const std::vector<v1::Piece> want = Expand(ExpertBucket());
    ASSERT_EQ(b.pieces_size(), static_cast<int>(want.size()));
    for (int i = 0; i < b.pieces_size(); ++i) {
      EXPECT_EQ(b.pieces(i).SerializeAsString(), want[i].SerializeAsString()) << i;
    }
  }
}

// The names sync_verify and sync_staged give a bucket in their messages.
TEST(PlanPiecesTest, BucketPieceNamesCountsMembers) {
  v1::Plan plan = TwoBucketPlan();
  EXPECT_EQ(BucketPieceNames(plan, plan.buckets(0)), "n1 and 4 more pieces");
  v1::Bucket runs_only = ExpertBucket();
  runs_only.clear_pieces();
  EXPECT_EQ(BucketPieceNames(plan, runs_only), "n10 and 2 more pieces");
  EXPECT_EQ(BucketPieceNames(plan, v1::Bucket()), "?");
  v1::Bucket one;
  *one.add_pieces() = Plain(3, 2, 0, 3, 0, 0);
  EXPECT_EQ(BucketPieceNames(plan, one), "n3");
}

}  // namespace
}  // namespace wsync
