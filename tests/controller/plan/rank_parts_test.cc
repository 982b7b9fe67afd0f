// Per-worker parts (controller/plan/rank_parts.h): copied field by field,
// views shared within a part, each part equal to ExtractRankPlan.
#include "controller/plan/rank_parts.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

std::vector<std::string> FieldNames(const google::protobuf::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return names;
}

// CopyBucket (rank_parts.cc) copies Bucket and Piece field by field: a new
// field must be added there too, and here.
TEST(RankPartsTest, CopiesEveryFieldOfBucketAndPiece) {
  EXPECT_EQ(FieldNames(v1::Bucket::descriptor()),
            std::vector<std::string>({"id", "sender", "receiver", "round", "bytes", "transport",
                                      "zero_copy", "pieces", "seq", "route", "runs", "put_phase",
                                      "step"}))
      << "a Bucket field changed: copy it in CopyBucket (rank_parts.cc)";
  EXPECT_EQ(
      FieldNames(v1::Piece::descriptor()),
      std::vector<std::string>({"tensor_name", "src", "dst", "bucket_offset", "wire_dtype",
                                "reduce_id", "relay", "quant_block", "scales_of", "quantize_id"}))
      << "a Piece field changed: copy it in CopyBucket (rank_parts.cc)";
}

// Every field set away from its default survives the split (a relay plan:
// the same views on many pieces of one worker).
TEST(RankPartsTest, PartsEqualExtractRankPlanAndShareViews) {
  v1::Plan plan = BuildAndVerify(FanOutSpec(/*disable_relay=*/false));
  ASSERT_GT(plan.summary().num_relay_pieces(), 0);
  for (v1::Bucket& b : *plan.mutable_buckets()) {
    b.set_route(v1::ROUTE_PEER_WRITE);
    b.set_zero_copy(!b.zero_copy());
    b.set_step(b.step() + 7);
    for (v1::Piece& p : *b.mutable_pieces()) {
      p.set_reduce_id(p.reduce_id() + 1);
      p.set_quantize_id(p.quantize_id() + 2);
      p.set_scales_of(p.scales_of() + 3);
      p.add_quant_block(4);
      p.add_quant_block(5);
    }
  }
  // A bucket's piece runs go with it (the split copies them whole).
  v1::PieceRun* run = plan.mutable_buckets(0)->add_runs();
  *run->mutable_first() = plan.buckets(0).pieces(0);
  run->set_count(2);
  run->set_dst_byte_step(64);
  // A view with fewer strides than dims is copied as it is, not shared.
  plan.mutable_buckets(0)->mutable_pieces(0)->mutable_dst()->clear_strides();
  const std::vector<RankPart> parts = SplitRankPlans(plan);
  ASSERT_EQ(parts.size(), static_cast<size_t>(plan.ranks_size()));
  int sharing = 0;
  for (const RankPart& part : parts) {
    absl::StatusOr<v1::Plan> want = ExtractRankPlan(plan, part.worker);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(DeterministicBytes(*part.plan) == DeterministicBytes(*want))
        << "worker " << part.worker;
    int64_t views = 0;
    absl::flat_hash_set<const v1::TensorView*> distinct;
    for (const v1::Bucket& b : part.plan->buckets()) {
      std::vector<const v1::Piece*> stored;  // plain pieces and each run's first
      for (const v1::Piece& p : b.pieces()) stored.push_back(&p);
      for (const v1::PieceRun& r : b.runs()) stored.push_back(&r.first());
      for (const v1::Piece* piece : stored) {
        const v1::Piece& p = *piece;
        views += 2;
        distinct.insert(&p.src());
        distinct.insert(&p.dst());
      }
    }
    if (static_cast<int64_t>(distinct.size()) < views) ++sharing;
  }
  EXPECT_GT(sharing, 0) << "no part shared a view";
}

}  // namespace
}  // namespace wsync::plan
