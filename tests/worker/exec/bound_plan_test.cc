#include "worker/exec/bound_plan.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/plan_builder.h"
#include "worker/exec/bound_plan_internal.h"

namespace wsync::exec {
namespace {

using testing::Piece;
using testing::PlanBuilder;
using testing::View;

class BindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Reg(BufferSide::kSource, "w", src_, v1::FP32);
    Reg(BufferSide::kDestination, "w", dst_, v1::BF16);
  }
  void Reg(BufferSide side, const std::string& name, std::vector<uint8_t>& mem, v1::DType dtype) {
    mem.assign(64 * 4, 0);
    RegisteredBuffer r{mem.data(), static_cast<int64_t>(mem.size()), dtype};
    ASSERT_TRUE(registry_.Register(side, name, r).ok());
  }
  absl::Status Bind(const v1::Plan& plan, int32_t worker) {
    return BindPlan(plan, worker, registry_, MemorySpace::kHost).status();
  }
  std::vector<uint8_t> src_, dst_;
  BufferRegistry registry_;
};

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 std::initializer_list<const char*> parts) {
  EXPECT_EQ(s.code(), code) << s;
  for (const char* p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << p << " in " << s;
}

// Data ops cache by the lists the executor prepares per plan instance (ItemsHandle): a copy may be
// changed, so it gets a new instance; the original keeps its own.
TEST(PlanInstanceTest, EveryPlanAndEveryCopyIsUnique) {
  BoundPlan a;
  BoundPlan b;
  EXPECT_NE(a.instance.value(), 0u);
  EXPECT_NE(a.instance.value(), b.instance.value());
  const uint64_t before = a.instance.value();
  BoundPlan copy = a;
  EXPECT_NE(copy.instance.value(), before);
  EXPECT_EQ(a.instance.value(), before);
  BoundPlan moved = std::move(copy);
  EXPECT_NE(moved.instance.value(), before);
  b = a;
  EXPECT_NE(b.instance.value(), a.instance.value());
}

TEST_F(BindTest, GoodPlanBindsBothSides) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {8, 8}, v1::FP32), View("w", 0, {8, 8}, v1::BF16), v1::BF16)});
  const v1::Plan plan = pb.Build();
  auto sender = BindPlan(plan, 0, registry_, MemorySpace::kHost);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_EQ((*sender)->rounds.size(), 1u);
  const BoundRound& r = (*sender)->rounds[0];
  ASSERT_EQ(r.pack.size(), 1u);
  EXPECT_EQ(r.pack[0].src.ndim, 1);  // [8,8] row-major coalesced to [64]
  EXPECT_EQ(r.pack[0].src.shape[0], 64);
  EXPECT_EQ(r.staging_bytes, 128);
  EXPECT_TRUE(BindPlan(plan, 1, registry_, MemorySpace::kHost).ok());
  // A worker with no part binds to an empty plan.
  auto idle = BindPlan(plan, 5, registry_, MemorySpace::kHost);
  ASSERT_TRUE(idle.ok());
  EXPECT_TRUE((*idle)->rounds.empty());
}

TEST_F(BindTest, ViewOutOfRangeNamesBufferBucketPiece) {
  PlanBuilder pb;
  pb.AddBucket(
      0, 1, 0,
      {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16),
       Piece(View("w", 60 * 4, {2, 4}, v1::FP32), View("w", 0, {2, 4}, v1::BF16), v1::BF16)});
  ExpectError(Bind(pb.Build(), 0), absl::StatusCode::kOutOfRange,
              {"worker 0", "round 0", "bucket 0", "piece 1", "source buffer 'w'", "256 bytes"});
}

TEST_F(BindTest, StridedExtentCountsLastElementOnly) {
  PlanBuilder pb;
  // 4 x 4 with row stride 16: last element at (3*16 + 3) * 4 = 204..208 <= 256: fits.
  pb.AddBucket(
      0, 1, 0,
      {Piece(View("w", 0, {4, 4}, v1::FP32, {16, 1}), View("w", 0, {4, 4}, v1::BF16), v1::BF16)});
  EXPECT_TRUE(Bind(pb.Build(), 0).ok());
  PlanBuilder bad;
  bad.AddBucket(
      0, 1, 0,
      {Piece(View("w", 4, {4, 4}, v1::FP32, {20, 1}), View("w", 0, {4, 4}, v1::BF16), v1::BF16)});
  ExpectError(Bind(bad.Build(), 0), absl::StatusCode::kOutOfRange, {"outside"});
}

// Issue 18 (plan parts are decoded at a trust boundary): a stride-0 view of
// 2^62 fp32 elements spans 4 bytes, but its packed size 2^62 * 4 wraps to 0,
// which a naive `offset + numel * size > bucket` check accepted; packing it
// would then write 2^64 bytes into a 16-byte staging slot.
TEST_F(BindTest, AViewWhosePackedSizeOverflowsIsRefused) {
  const int64_t k62 = int64_t{1} << 62;
  PlanBuilder pb;
  pb.AddBucket(
      0, 1, 0,
      {Piece(View("w", 0, {4}, v1::FP32, {0}), View("w", 0, {4}, v1::BF16, {0}), v1::FP32)});
  v1::Plan plan = pb.Build();
  plan.mutable_buckets(0)->mutable_pieces(0)->mutable_src()->set_shape(0, k62);
  plan.mutable_buckets(0)->mutable_pieces(0)->mutable_dst()->set_shape(0, k62);
  plan.mutable_buckets(0)->set_bytes(16);
  plan.mutable_ranks(0)->mutable_rounds(0)->set_staging_bytes(16);
  plan.mutable_ranks(1)->mutable_rounds(0)->set_staging_bytes(16);
  for (int32_t worker : {0, 1}) {
    absl::Status s = Bind(plan, worker);
    EXPECT_FALSE(s.ok()) << "worker " << worker;
    EXPECT_NE(s.message().find("bucket 0"), std::string::npos) << s;
    EXPECT_NE(s.message().find("overflows"), std::string::npos) << s;
  }
}

// Negative or wrapping bucket sizes from the plan never reach the staging layout.
TEST_F(BindTest, NegativeBucketBytesAreRefused) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16)});
  v1::Plan plan = pb.Build();
  plan.mutable_buckets(0)->set_bytes(-8);
  for (int32_t worker : {0, 1}) EXPECT_FALSE(Bind(plan, worker).ok()) << "worker " << worker;
}

// A step outside [0, kMaxBucketSteps), or a local bucket's step other than
// 0, is refused on both sides, naming the bucket and its step.
TEST_F(BindTest, StepsOutOfRangeAreRefused) {
  // (receiver, step): 0 makes a local bucket on worker 0.
  for (const auto& [receiver, step] : {std::pair{1, -1}, std::pair{1, 64}, std::pair{0, 1}}) {
    PlanBuilder pb;
    pb.AddBucket(0, receiver, 0,
                 {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16)});
    v1::Plan plan = pb.Build();
    plan.mutable_buckets(0)->set_step(step);
    ExpectError(Bind(plan, 0), absl::StatusCode::kInvalidArgument,
                {"bucket 0 has step", "outside"});
  }
}

TEST_F(BindTest, DtypeMismatchIsAnError) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::FP16), v1::BF16)});
  ExpectError(Bind(pb.Build(), 1), absl::StatusCode::kInvalidArgument,
              {"RECV bucket 0", "piece 0", "fp16", "registered as bf16"});
}

TEST_F(BindTest, UnregisteredBufferIsNotFound) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("nope", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16)});
  ExpectError(Bind(pb.Build(), 0), absl::StatusCode::kNotFound, {"'nope'", "bucket 0"});
}

TEST_F(BindTest, IntegerCastIsRefused) {
  std::vector<uint8_t> ints;
  Reg(BufferSide::kSource, "i", ints, v1::INT32);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("i", 0, {4}, v1::INT32), View("w", 0, {4}, v1::BF16), v1::FP32)});
  ExpectError(Bind(pb.Build(), 0), absl::StatusCode::kInvalidArgument, {"int32", "fp32"});
}

TEST_F(BindTest, StagingBeyondGrantIsRefused) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {16}, v1::FP32), View("w", 0, {16}, v1::BF16), v1::BF16)});
  v1::Plan plan = pb.Build();
  plan.mutable_ranks(0)->mutable_rounds(0)->set_staging_bytes(16);
  ExpectError(Bind(plan, 0), absl::StatusCode::kInvalidArgument, {"need 32", "grants 16"});
}

TEST_F(BindTest, BucketMissingFromOpsIsRefused) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16)});
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 16, {4}, v1::FP32), View("w", 8, {4}, v1::BF16), v1::BF16)});
  v1::Plan plan = pb.Build();
  plan.mutable_ranks(1)->mutable_rounds(0)->mutable_ops()->RemoveLast();
  ExpectError(Bind(plan, 1), absl::StatusCode::kInvalidArgument, {"bucket 1", "no op"});
}

TEST_F(BindTest, ZeroCopyNeedsContiguousSameDtype) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0, {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16)},
               /*zero_copy=*/true);
  ExpectError(Bind(pb.Build(), 0), absl::StatusCode::kInvalidArgument, {"zero-copy"});
}

// A block of whole rows of a row-major 2-D tensor is contiguous memory: it
// must pass as zero-copy; a column block of the same tensor must not.
TEST_F(BindTest, ZeroCopyAcceptsRowBlocksRefusesColumnBlocks) {
  std::vector<uint8_t> z;
  Reg(BufferSide::kDestination, "z", z, v1::FP32);
  PlanBuilder rows;
  rows.AddBucket(0, 1, 0,
                 {Piece(View("w", 32, {2, 8}, v1::FP32, {8, 1}),
                        View("z", 64, {2, 8}, v1::FP32, {8, 1}), v1::FP32)},
                 /*zero_copy=*/true);
  EXPECT_TRUE(Bind(rows.Build(), 0).ok()) << Bind(rows.Build(), 0);
  EXPECT_TRUE(Bind(rows.Build(), 1).ok()) << Bind(rows.Build(), 1);

  PlanBuilder cols;
  cols.AddBucket(0, 1, 0,
                 {Piece(View("w", 0, {4, 2}, v1::FP32, {8, 1}),
                        View("z", 0, {4, 2}, v1::FP32, {8, 1}), v1::FP32)},
                 /*zero_copy=*/true);
  ExpectError(Bind(cols.Build(), 0), absl::StatusCode::kInvalidArgument, {"zero-copy", "strided"});
}

// The plan's single bucket with its pieces [first, first + count) written
// as one run (members stepping by the first two pieces' differences).
v1::Plan WithRun(v1::Plan plan, int first, int count) {
  v1::Bucket* b = plan.mutable_buckets(0);
  const v1::Piece a = b->pieces(first), next = b->pieces(first + 1);
  v1::PieceRun* run = b->add_runs();
  *run->mutable_first() = a;
  run->set_count(count);
  run->set_src_byte_step(next.src().byte_offset() - a.src().byte_offset());
  run->set_dst_byte_step(next.dst().byte_offset() - a.dst().byte_offset());
  run->set_bucket_step(next.bucket_offset() - a.bucket_offset());
  b->mutable_pieces()->DeleteSubrange(first, count);
  return plan;
}

// Six 4-element pieces of one bucket, members 1..4 of them as a run: bound
// in place (ForEachPiece), the run's members give the same pack and unpack
// items as the pieces, in the same order (plain pieces, then members).
TEST_F(BindTest, RunMembersBindLikeTheirPieces) {
  PlanBuilder pb;
  std::vector<v1::Piece> pieces;
  for (int k = 0; k < 6; ++k) {
    pieces.push_back(
        Piece(View("w", 16 * k, {4}, v1::FP32), View("w", 8 * k, {4}, v1::BF16), v1::BF16));
  }
  pb.AddBucket(0, 1, 0, pieces);
  const v1::Plan plain = pb.Build();
  v1::Plan with_run = WithRun(plain, 1, 4);
  ASSERT_EQ(with_run.buckets(0).pieces_size(), 2);
  // Bound order: pieces 0 and 5, then the members 1..4.
  const std::vector<int> order = {0, 5, 1, 2, 3, 4};
  for (int32_t worker : {0, 1}) {
    auto a = BindPlan(plain, worker, registry_, MemorySpace::kHost);
    auto b = BindPlan(with_run, worker, registry_, MemorySpace::kHost);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const BoundRound& ra = (*a)->rounds.at(0);
    const BoundRound& rb = (*b)->rounds.at(0);
    ASSERT_EQ(ra.pack.size(), rb.pack.size()) << "worker " << worker;
    ASSERT_EQ(ra.unpack.size(), rb.unpack.size()) << "worker " << worker;
    for (size_t i = 0; i < rb.pack.size(); ++i) {
      EXPECT_EQ(rb.pack[i].src.data, ra.pack[order[i]].src.data) << "pack " << i;
      EXPECT_EQ(rb.pack[i].staging_offset, ra.pack[order[i]].staging_offset) << "pack " << i;
    }
    for (size_t i = 0; i < rb.unpack.size(); ++i) {
      EXPECT_EQ(rb.unpack[i].dst.data, ra.unpack[order[i]].dst.data) << "unpack " << i;
      EXPECT_EQ(rb.unpack[i].staging_offset, ra.unpack[order[i]].staging_offset) << "unpack " << i;
    }
  }
}

// A zero-copy bucket is one piece: a run beside it would be bound over the
// same bytes (regression: read in place, a run was no longer counted).
TEST_F(BindTest, ZeroCopyBucketWithARunIsRefused) {
  std::vector<uint8_t> z;
  Reg(BufferSide::kDestination, "z", z, v1::FP32);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("z", 0, {4}, v1::FP32), v1::FP32),
                Piece(View("w", 16, {4}, v1::FP32), View("z", 16, {4}, v1::FP32), v1::FP32),
                Piece(View("w", 32, {4}, v1::FP32), View("z", 32, {4}, v1::FP32), v1::FP32)},
               /*zero_copy=*/true);
  const v1::Plan plan = WithRun(pb.Build(), 1, 2);
  for (int32_t worker : {0, 1}) {
    ExpectError(Bind(plan, worker), absl::StatusCode::kInvalidArgument, {"zero-copy", "1 runs"});
  }
}

// A zero-copy bucket without pieces still has bytes to move: refused, on
// both sides, before anything would send or receive them from a null
// address (regression: it bound, with no address).
TEST_F(BindTest, ZeroCopyBucketWithoutPiecesIsRefused) {
  std::vector<uint8_t> z;
  Reg(BufferSide::kDestination, "z", z, v1::FP32);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0, {Piece(View("w", 0, {4}, v1::FP32), View("z", 0, {4}, v1::FP32), v1::FP32)},
               /*zero_copy=*/true);
  v1::Plan plan = pb.Build();
  plan.mutable_buckets(0)->clear_pieces();
  ASSERT_GT(plan.buckets(0).bytes(), 0);
  for (int32_t worker : {0, 1}) {
    ExpectError(Bind(plan, worker), absl::StatusCode::kInvalidArgument, {"zero-copy", "0 pieces"});
  }
}

TEST_F(BindTest, PartialWithoutReduceIsRefused) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::FP32, 7)});
  ExpectError(Bind(pb.Build(), 1), absl::StatusCode::kInvalidArgument, {"consumed by no reduce"});
}

TEST_F(BindTest, LocalCopyThroughThirdDtypeIsRefused) {
  std::vector<uint8_t> half;
  Reg(BufferSide::kDestination, "h", half, v1::FP16);
  PlanBuilder pb;
  pb.AddBucket(0, 0, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("h", 0, {4}, v1::FP16), v1::BF16)});
  ExpectError(Bind(pb.Build(), 0), absl::StatusCode::kUnimplemented,
              {"COPY bucket 0", "fp32 -> bf16 -> fp16"});
}

TEST_F(BindTest, WritingIntoASourceBufferIsRefused) {
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("w", 0, {4}, v1::FP32), View("w", 0, {4}, v1::BF16), v1::BF16)});
  v1::Plan plan = pb.Build();
  plan.mutable_buckets(0)->mutable_pieces(0)->mutable_dst()->set_side(v1::SOURCE_BUFFER);
  ExpectError(Bind(plan, 1), absl::StatusCode::kInvalidArgument,
              {"RECV bucket 0", "must name a destination buffer"});
}

// The sent buckets (bucket, put phase, puts) of PhasedPuts, in bind order,
// and a received one (no puts) between them.
struct PutsOf {
  int64_t bucket;
  int32_t phase;
  int32_t count;
};
constexpr PutsOf kPhasedPuts[] = {{7, 2, 2}, {8, 0, 1}, {9, 1, 3}};

// Put k of bucket b writes address 1000 b + k, and its origin names both.
BoundPlan PhasedPuts() {
  BoundPlan plan;
  for (const PutsOf& p : kPhasedPuts) {
    DirectBucket d;
    d.bucket = p.bucket;
    d.sent = true;
    d.put_phase = p.phase;
    d.first_put = static_cast<int32_t>(plan.puts.size());
    d.num_puts = p.count;
    plan.direct_buckets.push_back(d);
    for (int32_t k = 0; k < p.count; ++k) {
      CopyItem put;
      put.dst.data = reinterpret_cast<void*>(static_cast<uintptr_t>(1000 * p.bucket + k));
      plan.puts.push_back(put);
      plan.put_origins.push_back(absl::StrCat("bucket ", p.bucket, " put ", k));
    }
    if (p.bucket == 8) {
      DirectBucket received;
      received.bucket = 20;
      received.put_phase = 5;
      plan.direct_buckets.push_back(received);
    }
  }
  return plan;
}

TEST(OrderPutsByPhaseTest, PutsAndTheirOriginsFollowTheirBucketsPhases) {
  BoundPlan plan = PhasedPuts();
  ASSERT_TRUE(bind_internal::OrderPutsByPhase(plan).ok());
  std::vector<std::string> origins;
  for (const DirectBucket& d : plan.direct_buckets) {
    if (!d.sent) continue;
    for (int32_t k = 0; k < d.num_puts; ++k) {
      const size_t at = static_cast<size_t>(d.first_put + k);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(plan.puts[at].dst.data),
                static_cast<uintptr_t>(1000 * d.bucket + k));
      EXPECT_EQ(plan.put_origins[at], absl::StrCat("bucket ", d.bucket, " put ", k));
    }
  }
  // By phase: bucket 8 (phase 0), 9 (phase 1), then 7 (phase 2).
  EXPECT_EQ(plan.direct_buckets[1].first_put, 0);
  EXPECT_EQ(plan.direct_buckets[3].first_put, 1);
  EXPECT_EQ(plan.direct_buckets[0].first_put, 4);
  EXPECT_EQ(plan.put_origins.front(), "bucket 8 put 0");
  EXPECT_EQ(plan.put_origins.back(), "bucket 7 put 1");
}

// Put ranges that do not cover every put exactly once are an error and
// move nothing, also when their lengths add up to the number of puts.
TEST(OrderPutsByPhaseTest, OverlappingPutRangesAreAnErrorAndNothingMoves) {
  BoundPlan plan = PhasedPuts();
  plan.direct_buckets[1].first_put = 0;  // bucket 8's put over bucket 7's first
  const std::vector<std::string> before = plan.put_origins;
  ExpectError(bind_internal::OrderPutsByPhase(plan), absl::StatusCode::kInternal,
              {"bucket 7", "another bucket"});
  EXPECT_EQ(plan.put_origins, before);
  plan = PhasedPuts();
  plan.direct_buckets[3].num_puts = 4;  // past the end
  ExpectError(bind_internal::OrderPutsByPhase(plan), absl::StatusCode::kInternal,
              {"bucket 9", "outside"});
  plan = PhasedPuts();
  plan.direct_buckets[3].num_puts = 2;  // one put in no bucket
  ExpectError(bind_internal::OrderPutsByPhase(plan), absl::StatusCode::kInternal, {"5 of 6"});
}

TEST(CoalesceTest, MergesOnlyWhereAllViewsAllow) {
  auto a = MakeStridedView(nullptr, v1::FP32, std::vector<int64_t>{2, 1, 3, 4},
                           std::vector<int64_t>{12, 99, 4, 1});
  auto b = MakeStridedView(nullptr, v1::FP32, std::vector<int64_t>{2, 1, 3, 4},
                           std::vector<int64_t>{40, 7, 8, 1});
  ASSERT_TRUE(a.ok() && b.ok());
  StridedView one = *a;
  StridedView* single[] = {&one};
  CoalesceViews(single);
  EXPECT_EQ(one.ndim, 1);
  EXPECT_EQ(one.shape[0], 24);
  StridedView x = *a, y = *b;
  StridedView* both[] = {&x, &y};
  CoalesceViews(both);
  // b's dim 2 is not contiguous with dim 3 (stride 8 != 4), dims 0,2 (40 = 5 * 8) neither.
  ASSERT_EQ(x.ndim, 3);
  EXPECT_EQ(y.strides[0], 40);
  EXPECT_EQ(x.shape[2], 4);
  EXPECT_FALSE(
      MakeStridedView(nullptr, v1::FP32, std::vector<int64_t>{2, -1}, std::vector<int64_t>{1, 1})
          .ok());
}

}  // namespace
}  // namespace wsync::exec
