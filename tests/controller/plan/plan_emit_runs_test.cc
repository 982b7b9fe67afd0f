// Piece runs in the emitted plan (BuildOptions::emit_piece_runs,
// docs/plan-compact.md): catalog MoE cases planned with runs (a) carry runs
// and fewer piece records, (b) written out (ExpandPlanRuns) equal the plan
// planned without runs, each bucket's pieces in bucket-offset order (run
// members follow a bucket's other pieces), and (c) pass the reader's run
// checks and the replay oracle (VerifyPlan).
#include <string>

#include "catalog/case.h"
#include "common/dtype.h"
#include "common/plan_pieces.h"
#include "gtest/gtest.h"
#include "planner_test_util.h"
#include "tests/common/plan_runs_util.h"

namespace wsync::plan {
namespace {

using planner_testing::DeterministicBytes;

v1::TransferSpec CatalogCase(const std::string& model, const std::string& source,
                             const std::string& destination, bool fp8_block = false) {
  absl::StatusOr<catalog::CaseOptions> o = catalog::ParseCase(model, source, destination);
  EXPECT_TRUE(o.ok()) << o.status();
  if (!o.ok()) return {};
  o->fp8_block = fp8_block;
  absl::StatusOr<v1::TransferSpec> spec = catalog::BuildCase(*o);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::TransferSpec();
}

struct Records {
  int64_t pieces = 0, runs = 0, members = 0;
};

Records RecordsOf(const v1::Plan& plan) {
  Records r;
  for (const v1::Bucket& b : plan.buckets()) {
    r.pieces += b.pieces_size();
    r.runs += b.runs_size();
    for (const v1::PieceRun& run : b.runs()) r.members += run.count();
  }
  return r;
}

// Plans `spec` with runs and without and checks (a), (b), (c); returns the
// plan with runs.
v1::Plan ExpectRunsExpandToThePlanWithout(const v1::TransferSpec& spec) {
  BuildOptions on, off;
  on.record_plan_seconds = off.record_plan_seconds = false;
  off.emit_piece_runs = false;
  absl::StatusOr<v1::Plan> with = BuildPlan(spec, on);
  absl::StatusOr<v1::Plan> without = BuildPlan(spec, off);
  EXPECT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(without.ok()) << without.status();
  if (!with.ok() || !without.ok()) return {};
  const Records a = RecordsOf(*with), b = RecordsOf(*without);
  EXPECT_GT(a.runs, 0) << spec.name();
  EXPECT_EQ(b.runs, 0);
  EXPECT_EQ(a.pieces + a.members, b.pieces);
  EXPECT_LT(a.pieces + a.runs, b.pieces) << "runs did not shrink the piece records";
  EXPECT_EQ(with->summary().num_pieces(), without->summary().num_pieces());
  absl::Status checked = CheckPlanRuns(*with);
  EXPECT_TRUE(checked.ok()) << checked;
  if (!checked.ok()) return *with;
  v1::Plan expanded = ExpandPlanRuns(*with);
  v1::Plan reference = *without;
  wsync::testing::CanonicalPieceOrder(&expanded);
  wsync::testing::CanonicalPieceOrder(&reference);
  EXPECT_TRUE(DeterministicBytes(expanded) == DeterministicBytes(reference))
      << spec.name() << ": the plan with runs, written out, differs from the plan without";
  absl::Status verified = VerifyPlan(spec, *with);
  EXPECT_TRUE(verified.ok()) << verified;
  return *with;
}

// FSDP2 with separate HF experts into vLLM's stacked w13 / w2 (bf16 wire):
// a bucket carries the gate and up projections of consecutive experts in
// turn, each sequence its own run (members two pieces apart in the bucket).
TEST(PlanEmitRunsTest, FsdpExpertsIntoStackedExpertsFormInterleavedRuns) {
  const v1::Plan plan =
      ExpectRunsExpandToThePlanWithout(CatalogCase("tiny-qwen3-moe", "fsdp:4", "vllm-tp:2x2,ep"));
  bool interleaved = false;
  for (const v1::Bucket& b : plan.buckets()) {
    for (const v1::PieceRun& r : b.runs()) {
      const v1::Piece& f = r.first();
      int64_t member = DTypeSize(f.wire_dtype());
      for (int64_t d : f.dst().shape()) member *= d;
      interleaved = interleaved || r.bucket_step() > member;
    }
  }
  EXPECT_TRUE(interleaved) << "no run's members are interleaved with another's";
}

TEST(PlanEmitRunsTest, MegatronStackedExpertsIntoVllmEp) {
  ExpectRunsExpandToThePlanWithout(
      CatalogCase("tiny-qwen3-moe", "megatron:tp2,pp2,dp2,ep2", "vllm-tp:4x1,ep"));
}

// Block fp8: sender-quantized pieces, their scales and receiver-quantized
// inputs stay plain pieces (CheckPlanRuns refuses them in runs); the rest
// (norms, bf16 tensors) may form runs.
TEST(PlanEmitRunsTest, BlockFp8KeepsQuantizedPiecesPlain) {
  const v1::Plan plan =
      ExpectRunsExpandToThePlanWithout(CatalogCase("tiny-mla", "fsdp:3", "vllm-tp:2x1", true));
  int64_t quantized = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    for (const v1::Piece& p : b.pieces()) {
      quantized += p.quant_block_size() > 0 || p.quantize_id() != 0 || p.scales_of() != 0;
    }
  }
  EXPECT_GT(quantized, 0);
}

}  // namespace
}  // namespace wsync::plan
