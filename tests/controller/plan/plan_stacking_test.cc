// Tensor stacking (plan_stacking.h, BuildOptions::stacking): alike tensors
// planned as one and written back as runs. The oracle is replay
// (VerifyPlan: every destination element checked) and the structural
// invariants every plan keeps (ExpectInvariants: staging cap, summary
// counts, bounds); kAuto must leave every plan within the piece limit
// byte-identical.
#include "controller/plan/plan_stacking.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catalog/case.h"
#include "common/plan_pieces.h"
#include "controller/plan/plan_estimate.h"
#include "controller/plan/plan_stages.h"
#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

v1::TransferSpec CatalogCase(const std::string& model, const std::string& source,
                             const std::string& destination, bool fp8_block = false,
                             bool colocated = false) {
  absl::StatusOr<catalog::CaseOptions> o = catalog::ParseCase(model, source, destination);
  EXPECT_TRUE(o.ok()) << o.status();
  if (!o.ok()) return {};
  o->fp8_block = fp8_block;
  o->colocated = colocated;
  absl::StatusOr<v1::TransferSpec> spec = catalog::BuildCase(*o);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::TransferSpec();
}

BuildOptions Options(BuildOptions::Stacking stacking, int64_t max_pieces = 0) {
  BuildOptions o;
  o.record_plan_seconds = false;
  o.stacking = stacking;
  o.max_pieces = max_pieces;
  return o;
}

int64_t Records(const v1::Plan& plan) {
  int64_t n = 0;
  for (const v1::Bucket& b : plan.buckets()) n += b.pieces_size() + b.runs_size();
  return n;
}

int64_t ExpandedPieces(const v1::Plan& plan) {
  int64_t n = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    absl::StatusOr<int64_t> c = PieceCount(b);
    EXPECT_TRUE(c.ok()) << c.status();
    n += c.ok() ? *c : 0;
  }
  return n;
}

StackedSides Stack(const v1::TransferSpec& spec) {
  absl::StatusOr<CompiledSide> src = CompileSide(spec.source(), SideRole::kSource);
  absl::StatusOr<CompiledSide> dst = CompileSide(spec.destination(), SideRole::kDestination);
  EXPECT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  if (!src.ok() || !dst.ok()) return {};
  absl::StatusOr<StackedSides> s = StackSides(spec, *src, *dst);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : StackedSides();
}

// Plans `spec` stacked and unstacked; the stacked plan replays exactly,
// keeps every invariant and moves the same bytes. (Small specs may take more
// records stacked than the emitter's own runs: stacking pays where tensors
// are many, and kAuto uses it only there.)
v1::Plan ExpectStackedPlanReplays(const v1::TransferSpec& spec) {
  EXPECT_GT(Stack(spec).groups, 0) << spec.name() << ": nothing stacks, the test checks nothing";
  absl::StatusOr<v1::Plan> on = BuildPlan(spec, Options(BuildOptions::Stacking::kOn));
  absl::StatusOr<v1::Plan> off = BuildPlan(spec, Options(BuildOptions::Stacking::kOff));
  EXPECT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(off.ok()) << off.status();
  if (!on.ok() || !off.ok()) return {};
  absl::Status runs = CheckPlanRuns(*on);
  EXPECT_TRUE(runs.ok()) << runs;
  absl::Status verified = VerifyPlan(spec, *on);
  EXPECT_TRUE(verified.ok()) << spec.name() << ": " << verified;
  ExpectInvariants(spec, *on);
  EXPECT_EQ(on->key(), off->key());
  EXPECT_EQ(on->summary().destination_bytes(), off->summary().destination_bytes());
  EXPECT_EQ(on->summary().num_pieces(), ExpandedPieces(*on));
  return *on;
}

TEST(PlanStackingTest, ExpertsOfOneEpRankStackAcrossLayers) {
  const v1::TransferSpec spec = CatalogCase("tiny-qwen3-moe", "fsdp:4", "vllm-tp:2x2,ep");
  const StackedSides s = Stack(spec);
  ASSERT_GT(s.groups, 0);
  // Every stacked destination tensor is gone from the stacked side, replaced
  // by one tensor per group.
  EXPECT_EQ(s.dst.tensors.size(),
            spec.destination().tensors_size() - static_cast<size_t>(s.members) + s.groups);
  int experts = 0;
  for (const v1::TensorLayout& t : spec.destination().tensors()) {
    experts += t.name().find("w13_weight.") != std::string::npos ? 1 : 0;
  }
  EXPECT_GT(experts, 0);
  EXPECT_EQ(s.dst.Find("model.layers.0.mlp.experts.w13_weight.0"), nullptr);
  const v1::Plan plan = ExpectStackedPlanReplays(spec);
  // Written back as rows of runs: an expert slot of every layer in a row.
  int64_t rows = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    for (const v1::PieceRun& r : b.runs()) rows += r.outer_count() >= 2 ? 1 : 0;
  }
  EXPECT_GT(rows, 0);
}

TEST(PlanStackingTest, CatalogCasesReplay) {
  struct Case {
    const char* model;
    const char* source;
    const char* destination;
    bool fp8_block, colocated;
  };
  for (const Case& c : {
           Case{"tiny-qwen3-moe", "fsdp:8", "vllm-tp:2x4", false, false},
           Case{"tiny-qwen3-moe", "hsdp:2x4", "vllm-tp:4x2,ep", false, true},
           Case{"tiny-qwen3-moe", "megatron:tp2,pp2,dp2", "vllm-tp:4x2,ep", true, false},
           Case{"tiny-qwen3-moe", "megatron:tp2,pp1,dp2,ep2", "vllm-tp:2x4", false, false},
           Case{"tiny-llama", "fsdp:4", "vllm-tp:2x2", false, true},
           Case{"tiny-mla", "fsdp:3", "vllm-tp:2x1", true, false},
           Case{"tiny-mla", "megatron:tp2,pp1,dp2,ep2", "vllm-tp:2x2,ep", true, false},
       }) {
    SCOPED_TRACE(std::string(c.model) + " " + c.source + " -> " + c.destination);
    ExpectStackedPlanReplays(CatalogCase(c.model, c.source, c.destination, c.fp8_block,
                                         c.colocated));
  }
}

// kAuto: a spec within the piece limit plans exactly as unstacked; one the
// limit refuses unstacked is stacked, counted in records, and replays.
TEST(PlanStackingTest, AutoStacksOnlyWhatTheLimitRefuses) {
  const v1::TransferSpec spec = CatalogCase("tiny-qwen3-moe", "fsdp:8", "vllm-tp:8,ep");
  const int64_t shards = MinPiecesFromSpec(spec);
  absl::StatusOr<v1::Plan> off = BuildPlan(spec, Options(BuildOptions::Stacking::kOff));
  ASSERT_TRUE(off.ok()) << off.status();
  absl::StatusOr<v1::Plan> within =
      BuildPlan(spec, Options(BuildOptions::Stacking::kAuto, 10 * off->summary().num_pieces()));
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(DeterministicBytes(*off), DeterministicBytes(*within));

  const int64_t limit = shards - 1;
  absl::StatusOr<v1::Plan> refused =
      BuildPlan(spec, Options(BuildOptions::Stacking::kOff, limit));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<v1::Plan> stacked =
      BuildPlan(spec, Options(BuildOptions::Stacking::kAuto, limit));
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  EXPECT_LE(Records(*stacked), limit);
  EXPECT_GT(stacked->summary().num_pieces(), limit);  // expanded: over; records: within
  absl::Status verified = VerifyPlan(spec, *stacked);
  EXPECT_TRUE(verified.ok()) << verified;

  // Too few records even stacked: refused as unstacked, saying what
  // stacking reached.
  absl::StatusOr<v1::Plan> tiny = BuildPlan(spec, Options(BuildOptions::Stacking::kAuto, 3));
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(tiny.status().message()).find("counted from the spec"), std::string::npos)
      << tiny.status();
  EXPECT_NE(std::string(tiny.status().message()).find("planned stacked"), std::string::npos)
      << tiny.status();
}

// kAuto when the estimate lets a spec through but the exact counts refuse
// it (more transfers than source shards: every shard goes to 8 ranks): the
// unstacked planner stops right after its cells, and the spec is planned
// stacked.
// The count the stage named `prefix` reports before `what`, e.g. the
// transfers of "sources (212 cells, 522 transfers, 328 relays)"; -1 if none.
int64_t StageCount(const std::vector<StageCost>& stages, const std::string& prefix,
                   const std::string& what) {
  for (const StageCost& c : stages) {
    if (c.name.rfind(prefix, 0) != 0) continue;
    const size_t end = c.name.find(" " + what);
    if (end == std::string::npos) continue;
    const size_t begin = c.name.find_last_of("(, ", end - 1) + 1;
    return std::stoll(c.name.substr(begin, end - begin));
  }
  return -1;
}

TEST(PlanStackingTest, AutoStacksWhatTheExactCountsRefuse) {
  const v1::TransferSpec spec = CatalogCase("tiny-qwen3-moe", "fsdp:8", "vllm-tp:2x4,ep");
  std::vector<StageCost> stages;
  BuildOptions o = Options(BuildOptions::Stacking::kOff);
  o.stages = &stages;
  absl::StatusOr<v1::Plan> off = BuildPlan(spec, o);
  ASSERT_TRUE(off.ok()) << off.status();
  const int64_t cells = StageCount(stages, "cells (", "cells");
  const int64_t transfers = StageCount(stages, "sources (", "transfers");
  // Over the estimate and the cells, under the cells' deliveries.
  const int64_t limit = std::max(MinPiecesFromSpec(spec), cells) + 1;
  ASSERT_GT(transfers, 2 * limit) << cells << " cells";
  stages.clear();
  o.max_pieces = limit;
  absl::StatusOr<v1::Plan> refused = BuildPlan(spec, o);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("cells x their destinations"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(StageCount(stages, "sources (", "transfers"), -1)
      << "refused only after choosing sources";
  absl::StatusOr<v1::Plan> stacked =
      BuildPlan(spec, Options(BuildOptions::Stacking::kAuto, 2 * limit));
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  EXPECT_LE(Records(*stacked), 2 * limit);
  EXPECT_TRUE(HasPieceRunRows(*stacked)) << "planned unstacked";
  absl::Status verified = VerifyPlan(spec, *stacked);
  EXPECT_TRUE(verified.ok()) << verified;
}

// Without piece runs, a stacked plan's runs are written out (if its pieces
// fit the limit); with summary_only its summary is the stacked plan's.
TEST(PlanStackingTest, NoPieceRunsWritesTheStackedPlanOut) {
  const v1::TransferSpec spec = CatalogCase("tiny-qwen3-moe", "fsdp:4", "vllm-tp:2x2,ep");
  ASSERT_GT(Stack(spec).groups, 0);
  BuildOptions o = Options(BuildOptions::Stacking::kOn);
  o.emit_piece_runs = false;
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(HasPieceRuns(*plan));
  EXPECT_EQ(Records(*plan), plan->summary().num_pieces());
  absl::Status verified = VerifyPlan(spec, *plan);
  EXPECT_TRUE(verified.ok()) << verified;
  o.max_pieces = plan->summary().num_pieces() - 1;
  EXPECT_EQ(BuildPlan(spec, o).status().code(), absl::StatusCode::kResourceExhausted);
  o = Options(BuildOptions::Stacking::kOn);
  o.summary_only = true;
  absl::StatusOr<v1::Plan> summary = BuildPlan(spec, o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->buckets_size(), 0);
  EXPECT_GT(summary->summary().num_pieces(), 0);
  // The stacked plan's pieces: fewer than the members they stand for.
  EXPECT_LT(summary->summary().num_pieces(), plan->summary().num_pieces());
  EXPECT_EQ(summary->key(), plan->key());
}

// The cells stage's early check (cells x their destinations) never refuses
// a plan the exact transfer count lets through: block fp8 destinations on
// replicas send a rooted group's parts to its root only, so they count
// none. Each case is planned with the limit at exactly its transfers.
TEST(PlanStackingTest, TheEarlyTransferCheckIsALowerBound) {
  for (const v1::TransferSpec& spec :
       {CatalogCase("tiny-mla", "fsdp:2", "vllm-tp:1x3", true),
        CatalogCase("tiny-mla", "fsdp:3", "vllm-tp:2x2", true),
        CatalogCase("small-llama", "fsdp:3", "vllm-tp:1x4", true),
        CatalogCase("tiny-qwen3-moe", "fsdp:8", "vllm-tp:2x4,ep")}) {
    SCOPED_TRACE(spec.name());
    std::vector<StageCost> stages;
    BuildOptions o = Options(BuildOptions::Stacking::kOff);
    o.stages = &stages;
    ASSERT_TRUE(BuildPlan(spec, o).ok());
    const int64_t transfers = StageCount(stages, "sources (", "transfers");
    ASSERT_GT(transfers, 0);
    o = Options(BuildOptions::Stacking::kOff, transfers);
    absl::StatusOr<v1::Plan> at_limit = BuildPlan(spec, o);
    EXPECT_TRUE(at_limit.ok()) << at_limit.status();
    o.max_pieces = transfers - 1;
    EXPECT_EQ(BuildPlan(spec, o).status().code(), absl::StatusCode::kResourceExhausted);
  }
}

// A spec naming a tensor or buffer with the stacking prefix is planned
// unstacked (its names could collide with the stacked ones).
TEST(PlanStackingTest, SpecsUsingTheReservedPrefixAreNotStacked) {
  v1::TransferSpec spec = CatalogCase("tiny-qwen3-moe", "fsdp:4", "vllm-tp:2x2,ep");
  v1::TensorLayout* t = spec.mutable_source()->mutable_tensors(0);
  const std::string renamed = std::string(kStackPrefix) + "x";
  const std::string old = t->name();
  t->set_name(renamed);
  bool mapped = false;
  for (v1::TensorMapping& m : *spec.mutable_mappings()) {
    if (m.src() == old) {
      m.set_src(renamed);
      mapped = true;
    }
  }
  if (!mapped) {
    v1::TensorMapping* m = spec.add_mappings();
    m->set_dst(old);
    m->set_src(renamed);
    for (int64_t s : t->shape()) {
      m->add_dst_offset(0);
      m->mutable_src_box()->add_offset(0);
      m->mutable_src_box()->add_length(s);
    }
  }
  EXPECT_EQ(Stack(spec).groups, 0);
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec, Options(BuildOptions::Stacking::kOn));
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::Status verified = VerifyPlan(spec, *plan);
  EXPECT_TRUE(verified.ok()) << verified;
}

// Reverses bucket b's plain pieces, references to them following: the plan
// stays the same plan (piece order within a bucket is free).
void ReversePlainPieces(v1::Bucket* b, v1::Plan* plan) {
  const int n = b->pieces_size();
  for (int i = 0; i < n / 2; ++i) b->mutable_pieces()->SwapElements(i, n - 1 - i);
  for (v1::Piece& p : *b->mutable_pieces()) {
    if (p.scales_of() > 0) p.set_scales_of(n - 1 - (p.scales_of() - 1) + 1);
  }
  for (v1::Reduce& r : *plan->mutable_reduces()) {
    for (v1::ReduceInput& in : *r.mutable_inputs()) {
      if (in.bucket() == b->id()) in.set_piece(n - 1 - in.piece());
    }
  }
  for (v1::Quantize& q : *plan->mutable_quantizes()) {
    for (v1::QuantizeInput& in : *q.mutable_inputs()) {
      if (in.bucket() == b->id()) in.set_piece(n - 1 - in.piece());
    }
  }
}

// Pieces that reduces, quantizes or scale pieces name by index are still
// named right when stacking removes stacked plain pieces before them: the
// stacked plans of block-fp8 cases, each mixed bucket's plain pieces reversed so
// that stacked pieces come first, written back, replay.
TEST(PlanStackingTest, IndexedPiecesFollowWhenStackedPiecesBeforeThemMove) {
  int moved = 0;
  for (const v1::TransferSpec& spec :
       {CatalogCase("small-llama", "fsdp:3", "vllm-tp:2x1", true)}) {
    SCOPED_TRACE(spec.name());
    absl::StatusOr<CompiledSide> src = CompileSide(spec.source(), SideRole::kSource);
    absl::StatusOr<CompiledSide> dst = CompileSide(spec.destination(), SideRole::kDestination);
    ASSERT_TRUE(src.ok() && dst.ok());
    absl::StatusOr<StackedSides> s = StackSides(spec, *src, *dst);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_GT(s->groups, 0);
    BuildOptions plain = Options(BuildOptions::Stacking::kOff);
    plain.emit_piece_runs = false;  // stacked pieces as plain pieces, beside indexed ones
    absl::StatusOr<v1::Plan> plan = BuildPlanFromCompiled(s->spec, s->src, s->dst, plain);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::set<std::pair<int64_t, int32_t>> named;  // (bucket, piece) named by index
    for (const v1::Reduce& r : plan->reduces()) {
      for (const v1::ReduceInput& in : r.inputs()) named.emplace(in.bucket(), in.piece());
    }
    for (const v1::Quantize& q : plan->quantizes()) {
      for (const v1::QuantizeInput& in : q.inputs()) named.emplace(in.bucket(), in.piece());
    }
    for (v1::Bucket& b : *plan->mutable_buckets()) {
      bool stacked = false, indexed = false;
      for (int i = 0; i < b.pieces_size(); ++i) {
        const v1::Piece& p = b.pieces(i);
        stacked = stacked || plan->names(p.tensor_name()).rfind(kStackPrefix, 0) == 0;
        indexed = indexed || named.count({b.id(), i}) > 0 || p.scales_of() > 0;
      }
      if (!stacked || !indexed) continue;
      ReversePlainPieces(&b, &*plan);
      ++moved;
    }
    ASSERT_TRUE(UnstackPlan(*s, *src, *dst, &*plan).ok());
    plan->set_key(PlanKey(spec));
    absl::Status verified = VerifyPlan(spec, *plan);
    EXPECT_TRUE(verified.ok()) << verified;
  }
  EXPECT_GT(moved, 0) << "no bucket mixes stacked and indexed pieces: the test checks nothing";
}

}  // namespace
}  // namespace wsync::plan
