// BuildPlanInto (planner.h), the planner's front door: the early piece
// limit, compiling both sides, and tensor stacking (plan_stacking.h): when
// to stack, planning the stacked sides, writing the plan back.
#include <chrono>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/plan_pieces.h"
#include "common/status_macros.h"
#include "controller/plan/plan_estimate.h"
#include "controller/plan/plan_stacking.h"
#include "controller/plan/planner.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan {
namespace {

using planner_detail::CheckPlanLimit;
using planner_detail::IsPieceLimitRefusal;
using planner_detail::kPiecesFlag;

int64_t Records(const v1::Plan& plan) {
  int64_t n = 0;
  for (const v1::Bucket& b : plan.buckets()) n += b.pieces_size() + b.runs_size();
  return n;
}

// Without piece runs (BuildOptions::emit_piece_runs off): every run written
// out, if the pieces fit the limit.
absl::Status WriteRunsOut(const BuildOptions& build, v1::Plan* out) {
  RETURN_IF_ERROR(CheckPlanLimit("pieces (runs written out)", out->summary().num_pieces(),
                                 build.max_pieces, kPiecesFlag));
  for (v1::Bucket& b : *out->mutable_buckets()) {
    if (b.runs_size() > 0) b = ExpandRuns(b);
  }
  return absl::OkStatus();
}

// A worker binds its part's runs written out: each worker's part (the
// buckets it sends or receives) stands for at most kMaxRunMembers pieces in
// runs, what its binder and the controller's part checks accept.
absl::Status CheckPartMembers(const v1::Plan& plan) {
  absl::flat_hash_map<int32_t, int64_t> members;
  for (const v1::Bucket& b : plan.buckets()) {
    int64_t n = 0;
    for (const v1::PieceRun& r : b.runs()) n += RunMembers(r);  // the planner's: no overflow
    for (int side = 0; side < (b.sender() == b.receiver() ? 1 : 2); ++side) {
      const int32_t worker = side == 0 ? b.sender() : b.receiver();
      int64_t& m = members[worker];
      if (n > kMaxRunMembers - m) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "stacked, worker ", worker, "'s part would stand for more than ", kMaxRunMembers,
            " pieces in runs (what a worker binds); spread the destination over more workers"));
      }
      m += n;
    }
  }
  return absl::OkStatus();
}

// The planner on stacked sides, written back. The stacked planner's working
// records (transfers before they merge into pieces) may reach 4 x the
// limit; the plan written back, the limit.
absl::Status BuildStacked(const v1::TransferSpec& spec, const StackedSides& stacked,
                          const CompiledSide& source, const CompiledSide& destination,
                          const BuildOptions& build, StageClock* clock, v1::Plan* out) {
  BuildOptions inner = build;
  inner.max_pieces = build.max_pieces > std::numeric_limits<int64_t>::max() / 4
                         ? 0
                         : 4 * build.max_pieces;
  if (absl::Status s = BuildPlanFromCompiledInto(stacked.spec, stacked.src, stacked.dst, out, inner);
      !s.ok()) {
    if (!IsPieceLimitRefusal(s)) return s;
    absl::Status r = absl::ResourceExhaustedError(absl::StrCat(
        s.message(), " (the stacked planner's working records: 4 x the piece limit)"));
    s.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
      r.SetPayload(url, payload);
    });
    return r;
  }
  clock->Skip();  // the stages above marked their own
  out->set_key(PlanKey(spec));
  if (build.summary_only) return absl::OkStatus();  // the stacked plan's counts
  RETURN_IF_ERROR(UnstackPlan(stacked, source, destination, out));
  if (!build.emit_piece_runs) RETURN_IF_ERROR(WriteRunsOut(build, out));
  const int64_t records = Records(*out);
  clock->Mark(absl::StrCat("unstack (", stacked.groups, " groups of ", stacked.members,
                           " tensors; ", records, " pieces and runs)"));
  RETURN_IF_ERROR(CheckPlanLimit("pieces and runs", records, build.max_pieces, kPiecesFlag));
  return CheckPartMembers(*out);
}

// Plans stacked. `refusal`: why the spec is not planned unstacked (OK under
// kOn); when nothing stacks, or the stacked plan fails too, that refusal is
// the answer (with what stacking reached).
absl::Status PlanStacked(const v1::TransferSpec& spec, const CompiledSide& source,
                         const CompiledSide& destination, const BuildOptions& build,
                         const absl::Status& refusal, StageClock* clock, v1::Plan* out) {
  absl::StatusOr<StackedSides> stacked = StackSides(spec, source, destination);
  if (!stacked.ok()) {
    if (refusal.ok()) return stacked.status();
    return absl::ResourceExhaustedError(absl::StrCat(refusal.message(), "; stacking failed: ",
                                                     stacked.status().message()));
  }
  clock->Mark(absl::StrCat("stack (", stacked->groups, " groups of ", stacked->members,
                           " tensors)"));
  if (stacked->groups == 0) {
    if (!refusal.ok()) return refusal;  // nothing alike: refused as unstacked
    return BuildPlanFromCompiledInto(spec, source, destination, out, build);
  }
  const absl::Status s = BuildStacked(spec, *stacked, source, destination, build, clock, out);
  if (refusal.ok() || s.ok()) return s;
  return absl::ResourceExhaustedError(
      absl::StrCat(refusal.message(), "; planned stacked (", stacked->groups, " groups of ",
                   stacked->members, " alike tensors as one each), ", s.message()));
}

absl::Status BuildPlanIntoImpl(const v1::TransferSpec& spec, v1::Plan* out,
                               const BuildOptions& build) {
  const auto start = std::chrono::steady_clock::now();
  StageClock clock(build.stages);
  using Stacking = BuildOptions::Stacking;
  // Before compiling: a spec of millions of source shards is refused here, in
  // milliseconds, not after gigabytes of fragments and cells, unless
  // stacking may plan it in fewer records.
  absl::Status estimate;
  if (build.max_pieces > 0 && build.stacking != Stacking::kOn) {
    estimate = CheckPlanLimit(
        "pieces (at least: source shards read, counted from the spec)", MinPiecesFromSpec(spec),
        build.max_pieces, kPiecesFlag,
        "every source shard a mapping reads is a piece of its own: fewer, larger shards "
        "(e.g. stacked experts) or a higher limit");
    if (!estimate.ok() && build.stacking == Stacking::kOff) return estimate;
  }
  clock.Mark("estimate pieces");
  ASSIGN_OR_RETURN(CompiledSide source, CompileSide(spec.source(), SideRole::kSource));
  clock.Mark("compile source");
  ASSIGN_OR_RETURN(CompiledSide destination,
                   CompileSide(spec.destination(), SideRole::kDestination));
  clock.Mark("compile destination");
  if (build.stacking == Stacking::kOn || !estimate.ok()) {
    RETURN_IF_ERROR(PlanStacked(spec, source, destination, build, estimate, &clock, out));
  } else {
    absl::Status s = BuildPlanFromCompiledInto(spec, source, destination, out, build);
    // Auto: a spec the exact counts refuse (more transfers than shards: the
    // estimate let it through) is planned stacked.
    if (build.stacking == Stacking::kAuto && IsPieceLimitRefusal(s)) {
      clock.Skip();
      s = PlanStacked(spec, source, destination, build, s, &clock, out);
    }
    RETURN_IF_ERROR(s);
  }
  if (build.record_plan_seconds) {
    out->mutable_summary()->set_plan_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildPlanInto(const v1::TransferSpec& spec, v1::Plan* out, const BuildOptions& build) {
  out->Clear();
  absl::Status s = BuildPlanIntoImpl(spec, out, build);
  if (!s.ok()) out->Clear();  // never a half-written plan
  return s;
}

}  // namespace wsync::plan
