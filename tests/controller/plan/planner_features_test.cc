// Relays, partial reduces, fused / stacked mappings, strided views, zero-copy
// and tiny caps; each plan replayed and checked element by element.
#include <algorithm>
#include <map>
#include <set>

#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

TEST(PlannerRelayTest, FanOutRelaysKeepEgressAtTheBalancedShare) {
  const v1::TransferSpec spec = FanOutSpec(false);
  v1::Plan plan = BuildAndVerify(spec);
  EXPECT_GT(plan.summary().num_relay_pieces(), 0);
  // Every inference rank needs 6 * 64 * 16 * 4 bytes; the balanced egress
  // share is the same amount (24 workers, 16 of them receive).
  const int64_t need = 6 * 64 * 16 * 4;
  EXPECT_EQ(plan.summary().max_rank_bytes_in(), need);
  EXPECT_LE(plan.summary().max_rank_bytes_out(), need * 5 / 4);
  for (const v1::RankSummary& r : plan.summary().ranks()) {
    EXPECT_LE(r.bytes_out(), need * 5 / 4) << "worker " << r.worker();
  }
  // Few, small pieces: relay depth costs whole rounds here.
  EXPECT_LE(plan.summary().predicted_seconds(), 2.5 * plan.summary().lower_bound_seconds());
  // Relays come strictly after the round that delivered their data: the
  // replay checks the values; here check no relay reads a buffer in round 0.
  ForEachPlanPiece(plan, [](const v1::Bucket& b, const v1::Piece& p) {
    if (p.relay()) EXPECT_GT(b.round(), 0);
  });
}

TEST(PlannerRelayTest, DisableRelaySendsEverythingFromTheSource) {
  v1::Plan plan = BuildAndVerify(FanOutSpec(true));
  EXPECT_EQ(plan.summary().num_relay_pieces(), 0);
  EXPECT_EQ(plan.summary().max_rank_bytes_out(), 8 * 6 * 64 * 32 * 4 / 2);
}

TEST(PlannerRelayTest, RelaysStayWithinOneDtype) {
  // Replicas in bf16 relay among themselves; the fp32 replica gets its own.
  v1::Side src = Side("trainer", Range(0, 1));
  v1::Side dst = Side("infer", Range(10, 6));
  Mesh(&src, "w", {32, 32}, {1}, {Rep()});
  Mesh(&src, "w32", {32, 32}, {1}, {Rep()});
  Mesh(&dst, "w", {32, 32}, {6}, {Rep()}, v1::BF16);
  Mesh(&dst, "w32", {32, 32}, {6}, {Rep()}, v1::FP32);
  v1::TransferSpec spec = Spec(src, dst);
  AllowCast(&spec, v1::FP32, v1::BF16);
  v1::Plan plan = BuildAndVerify(spec);
  EXPECT_GT(plan.summary().num_relay_pieces(), 0);
  ForEachPlanPiece(plan, [](const v1::Bucket&, const v1::Piece& p) {
    if (p.relay()) EXPECT_EQ(p.src().dtype(), p.dst().dtype());
  });
}

TEST(PlannerPartialTest, ReducesAtTheReceiverInSourceDtype) {
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", {2, 10});  // worker 2 is also a partial member
  v1::TensorLayout* t = Explicit(&src, "w", {6, 4}, v1::BF16);
  for (int r = 0; r < 3; ++r) Frag(t, r, {0, 0}, {6, 4})->set_partial_group(7);
  Frag(t, 3, {0, 0}, {3, 4});  // a full copy of the top half
  Mesh(&dst, "w", {6, 4}, {2}, {Rep()}, v1::FP32);
  v1::TransferSpec spec = Spec(src, dst);
  AllowCast(&spec, v1::BF16, v1::FP32);
  v1::Plan plan = BuildAndVerify(spec);
  ASSERT_GT(plan.reduces_size(), 0);
  for (const v1::Reduce& r : plan.reduces()) {
    EXPECT_EQ(r.accumulate_dtype(), v1::BF16);
    EXPECT_EQ(r.dst().dtype(), v1::FP32);
    std::set<int32_t> senders;
    for (const v1::ReduceInput& in : r.inputs()) {
      const v1::Bucket& b = plan.buckets(in.bucket());
      EXPECT_EQ(b.round(), r.round());
      EXPECT_EQ(b.pieces(in.piece()).wire_dtype(), v1::BF16);
      senders.insert(b.sender());
      if (b.sender() == r.worker()) EXPECT_EQ(b.transport(), v1::TRANSPORT_LOCAL);
    }
    EXPECT_EQ(senders.size(), 3u);
    // The full copy covers rows 0:3; only rows 3:6 need a reduce.
    EXPECT_GE(r.dst().shape(0) > 0 ? 3 : 0, 0);
  }
}

TEST(PlannerMappingTest, FusedQkvAndGateUp) {
  // vLLM TP2: rank r holds [q_r; k_r; v_r] in one buffer, [gate_r; up_r] in another.
  const int64_t h = 8, tp = 2, rows = h / tp;
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(10, tp));
  for (const char* n : {"q", "k", "v", "gate", "up"}) Mesh(&src, n, {h, 6}, {4}, {Sh(0)});
  v1::TensorLayout* qkv = Explicit(&dst, "qkv", {3 * h, 6});
  v1::TensorLayout* gu = Explicit(&dst, "gate_up", {2 * h, 6});
  for (int r = 0; r < tp; ++r) {
    for (int part = 0; part < 3; ++part) {
      Frag(qkv, r, {part * h + r * rows, 0}, {rows, 6}, "qkv", part * rows * 6 * 4);
    }
    for (int part = 0; part < 2; ++part) {
      Frag(gu, r, {part * h + r * rows, 0}, {rows, 6}, "gate_up", part * rows * 6 * 4);
    }
  }
  v1::TransferSpec spec = Spec(src, dst);
  Map(&spec, "qkv", {0, 0}, "q", {0, 0}, {h, 6});
  Map(&spec, "qkv", {h, 0}, "k", {0, 0}, {h, 6});
  Map(&spec, "qkv", {2 * h, 0}, "v", {0, 0}, {h, 6});
  Map(&spec, "gate_up", {0, 0}, "gate", {0, 0}, {h, 6});
  Map(&spec, "gate_up", {h, 0}, "up", {0, 0}, {h, 6});
  BuildAndVerify(spec);
}

TEST(PlannerMappingTest, StackedExpertsBothWays) {
  const int experts = 4;
  // Trainer: one [4, 6] tensor per expert, expert e on rank e % 2 (+ DP copy).
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(10, 2));
  for (int e = 0; e < experts; ++e) {
    v1::TensorLayout* t = Explicit(&src, "e" + std::to_string(e), {4, 6});
    Frag(t, e % 2, {0, 0}, {4, 6});
    Frag(t, 2 + e % 2, {0, 0}, {4, 6});
  }
  // Inference: stacked [4, 4, 6], EP over 2.
  Mesh(&dst, "experts", {experts, 4, 6}, {2}, {Sh(0)});
  v1::TransferSpec spec = Spec(src, dst);
  for (int e = 0; e < experts; ++e)
    Map(&spec, "experts", {e, 0, 0}, "e" + std::to_string(e), {0, 0}, {4, 6});
  BuildAndVerify(spec);

  // And back: stacked trainer tensor to per-expert inference tensors.
  v1::Side src2 = Side("trainer", Range(0, 2));
  v1::Side dst2 = Side("infer", Range(10, 2));
  Mesh(&src2, "experts", {experts, 4, 6}, {2}, {Sh(1)});
  for (int e = 0; e < experts; ++e) Mesh(&dst2, "x" + std::to_string(e), {4, 6}, {2}, {Sh(0)});
  v1::TransferSpec spec2 = Spec(src2, dst2);
  for (int e = 0; e < experts; ++e)
    Map(&spec2, "x" + std::to_string(e), {0, 0}, "experts", {e, 0, 0}, {1, 4, 6});
  BuildAndVerify(spec2);
}

TEST(PlannerViewTest, StridedAndOffsetViews) {
  // Column-major destination fragment, source fragments at byte offsets of a
  // shared flat buffer.
  v1::Side src = Side("trainer", Range(0, 2));
  v1::Side dst = Side("infer", Range(10, 1));
  v1::TensorLayout* a = Explicit(&src, "a", {4, 6});
  Frag(a, 0, {0, 0}, {2, 6}, "flat", 64);
  Frag(a, 1, {2, 0}, {2, 6}, "flat", 0);
  v1::TensorLayout* b = Explicit(&src, "b", {5});
  Frag(b, 0, {0}, {5}, "flat", 64 + 48, {2});  // every other element
  v1::TensorLayout* da = Explicit(&dst, "a", {4, 6});
  Frag(da, 0, {0, 0}, {4, 6}, "cm", 0, {1, 4});
  v1::TensorLayout* db = Explicit(&dst, "b", {5});
  Frag(db, 0, {0}, {5}, "cm", 200);
  BuildAndVerify(Spec(src, dst));
}

TEST(PlannerBucketTest, ZeroCopyForLargeContiguousPieces) {
  v1::Side src = Side("trainer", Range(0, 2));
  v1::Side dst = Side("infer", Range(10, 2));
  Mesh(&src, "big", {64, 16}, {2}, {Sh(0)});
  Mesh(&dst, "big", {64, 16}, {2}, {Sh(0)});
  Mesh(&src, "small", {4, 4}, {2}, {Sh(0)});
  Mesh(&dst, "small", {4, 4}, {2}, {Sh(1)});
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_zero_copy_min_bytes(1024);
  spec.mutable_options()->set_bucket_bytes(1024);
  v1::Plan plan = BuildAndVerify(spec);
  int zc = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    if (!b.zero_copy()) continue;
    ++zc;
    EXPECT_EQ(b.pieces_size(), 1);
    EXPECT_EQ(plan.names(b.pieces(0).tensor_name()), "big");
  }
  EXPECT_EQ(zc, 4);  // 2 pieces of 2 KiB, each split in two at B = 1 KiB
  for (const v1::RankPlan& rp : plan.ranks()) {
    for (const v1::Round& r : rp.rounds()) EXPECT_LE(r.staging_bytes(), 2 * 4 * 4 * 2);
  }
}

TEST(PlannerRoundTest, TinyCapsGiveManyRoundsAndNeverExceedTheCap) {
  v1::Side src = Side("trainer", Range(0, 4), 2);
  v1::Side dst = Side("infer", Range(8, 4), 2);
  for (int t = 0; t < 10; ++t) {
    const std::string n = "t" + std::to_string(t);
    Mesh(&src, n, {16, 12}, {2, 2}, {Rep(), Sh(0)});
    Mesh(&dst, n, {16, 12}, {4}, {Sh(1)});
  }
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(96);
  spec.mutable_options()->set_staging_cap_bytes(256);
  v1::Plan plan = BuildAndVerify(spec);
  EXPECT_GE(plan.num_rounds(), 8);
  EXPECT_LE(plan.summary().peak_staging_bytes(), 256);
  for (const v1::RankPlan& rp : plan.ranks()) {
    for (const v1::Round& r : rp.rounds()) EXPECT_LE(r.staging_bytes(), 256);
  }
}

TEST(PlannerBalanceTest, EveryReplicaSendsNoFunnel) {
  // 4 DP replicas of a TP2 trainer, 2 inference ranks: all 8 trainer ranks send.
  v1::Side src = Side("trainer", Range(0, 8), 8);
  v1::Side dst = Side("infer", Range(8, 2), 8);
  for (int t = 0; t < 8; ++t) {
    const std::string n = "t" + std::to_string(t);
    Mesh(&src, n, {64, 64}, {4, 2}, {Rep(), Sh(1)});
    Mesh(&dst, n, {64, 64}, {2}, {Sh(0)});
  }
  v1::Plan plan = BuildAndVerify(Spec(src, dst));
  int senders = 0;
  for (const v1::RankSummary& r : plan.summary().ranks()) {
    if (r.worker() < 8 && r.bytes_out() > 0) ++senders;
  }
  EXPECT_EQ(senders, 8);
  EXPECT_LE(plan.summary().predicted_seconds(), 1.05 * plan.summary().lower_bound_seconds());
}

}  // namespace
}  // namespace wsync::plan
