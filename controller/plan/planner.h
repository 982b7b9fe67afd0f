// The reshard planner: turns a TransferSpec (both sides' layouts, mappings,
// options) into a v1::Plan of per-worker rounds of bucketed send/recv/copy/
// reduce ops. Pure function of its input (byte-identical output for identical
// input, except summary.plan_seconds, the wall time).
//
// Stages: plan_validate.cc (spec checks), plan_mapping.cc (regions -> cells;
// block fp8 in plan_quant.cc; once per tensor class, plan_classes.h and
// plan_class_cells.cc), plan_sources.cc (replicas, relays, reduces),
// plan_buckets.cc, plan_rounds.cc (+ plan_units.cc, plan_round_list.cc), plan_emit.cc
// (+ plan_summary.cc).
#ifndef WSYNC_CONTROLLER_PLAN_PLANNER_H_
#define WSYNC_CONTROLLER_PLAN_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/plan_stages.h"
#include "controller/plan/stacking_mode.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

// Defaults of PlanOptions fields left at 0.
inline constexpr int64_t kDefaultBucketBytes = 256ll << 20;
inline constexpr int64_t kDefaultStagingCapBytes = 2ll << 30;
inline constexpr int64_t kDefaultZeroCopyMinBytes = 32ll << 20;
inline constexpr double kDefaultNvlinkBytesPerSecond = 370e9;
inline constexpr double kDefaultNicBytesPerSecond = 50e9;
inline constexpr double kDefaultLocalCopyBytesPerSecond = 2e12;

struct BuildOptions {
  // Fill only key, num_rounds and summary (no buckets, reduces or rank
  // plans): the same decisions, without materializing per-piece protos.
  bool summary_only = false;
  // Record wall time in summary.plan_seconds (the one nondeterministic field).
  bool record_plan_seconds = true;
  // Most buckets / pieces the plan may have (0: no limit). Checked as early
  // as each count is known: a lower bound of the buckets (destination bytes /
  // working bucket size) before any per-piece array is built, the cells
  // after mapping, and the exact counts before the plan is emitted. Over
  // either: RESOURCE_EXHAUSTED naming the count and the limit
  // (wsync-controller's --max_plan_buckets / --max_plan_pieces).
  int64_t max_buckets = 0;
  int64_t max_pieces = 0;
  // When set, one StageCost per planner stage is appended (measurement only;
  // the plan does not depend on it).
  std::vector<StageCost>* stages = nullptr;
  // Map tensors into cells once per tensor class (identically laid-out
  // tensors, plan_classes.h) and copy the result to the class's other
  // members. The plan is the same either way; off: every tensor computed.
  bool tensor_classes = true;
  // Write a bucket's plain pieces that step regularly (same shapes, strides,
  // dtypes, wire dtype and relay; names, byte offsets and bucket offsets
  // advancing by constants) as one PieceRun each (docs/plan-compact.md).
  // Expanded (ExpandPlanRuns), the plan has the pieces it has with this off,
  // each bucket's run members moved after its other pieces.
  bool emit_piece_runs = true;
  // Measurement only: return CANCELLED once the cells are built (after their
  // limit check), so that the stages up to there can be measured (`stages`)
  // on specs whose later stages would not fit in memory.
  bool stop_after_cells = false;
  // Tensor stacking (plan_stacking.h): plan each group of alike destination
  // tensors as one stacked tensor, then write its pieces back as the
  // members' runs (with rows). kAuto stacks only a spec whose unstacked
  // plan the piece limit refuses (more source shards read than max_pieces,
  // or, planned, more transfers), so every plan within the limit is what it
  // was; such a spec with nothing alike, or over the limit stacked too, is
  // refused as before. Stacked, max_pieces bounds the plan's records (plain
  // pieces and runs), and the stacked planner's working records 4 x that.
  // With summary_only, a stacked plan's summary counts its stacked pieces.
  using Stacking = StackingMode;
  Stacking stacking = Stacking::kAuto;
};

absl::StatusOr<v1::Plan> BuildPlan(const v1::TransferSpec& spec,
                                   const BuildOptions& build = BuildOptions());

// Same, into *out (cleared first). With *out on a google::protobuf::Arena
// every bucket, piece and view of the plan is allocated there (the way to
// plan large transfers: docs/performance-notes.md), and pieces whose views
// are equal share one TensorView message (plan_views.h): such a plan is
// read-only; copy it (a deep copy) to change it.
absl::Status BuildPlanInto(const v1::TransferSpec& spec, v1::Plan* out,
                           const BuildOptions& build = BuildOptions());

// Same, for sides compiled already (CompileSide). `spec` supplies mappings,
// options and the key; its sides are not read again.
absl::StatusOr<v1::Plan> BuildPlanFromCompiled(const v1::TransferSpec& spec,
                                               const CompiledSide& source,
                                               const CompiledSide& destination,
                                               const BuildOptions& build = BuildOptions());
absl::Status BuildPlanFromCompiledInto(const v1::TransferSpec& spec, const CompiledSide& source,
                                       const CompiledSide& destination, v1::Plan* out,
                                       const BuildOptions& build = BuildOptions());

// Hex FNV-1a-64 over the deterministic serialization of source, destination,
// mappings and options (the name is not part of the key).
std::string PlanKey(const v1::TransferSpec& spec);

// The part of `plan` that `worker` executes: its RankPlan, every bucket it
// sends or receives (ids unchanged), every reduce and quantize it runs, key
// and num_rounds.
// The summary keeps only that worker's RankSummary. Error if the worker has
// no part in the plan.
absl::StatusOr<v1::Plan> ExtractRankPlan(const v1::Plan& plan, int32_t worker);

// Link model with defaults filled in for zero fields.
v1::LinkModel EffectiveLinkModel(const v1::PlanOptions& options);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLANNER_H_
