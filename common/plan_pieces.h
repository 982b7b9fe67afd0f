// A bucket's pieces in order (docs/plan-compact.md): its plain `pieces`, then
// every PieceRun's members. Member k of a run is the run's `first` with its
// names, byte offsets and bucket offset advanced by k steps. Readers of a
// plan go through ForEachPiece instead of Bucket.pieces, so that a plan
// with runs and the same plan with its runs written out as pieces read the
// same.
#ifndef WSYNC_COMMON_PLAN_PIECES_H_
#define WSYNC_COMMON_PLAN_PIECES_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wsync/v1/plan.pb.h"

namespace wsync {

// Workers that read PieceRun rows (outer_count) register this capability.
// An older worker would read each run's first row only and leave the other
// rows' bytes unwritten, so the controller refuses to hand it a part with
// rows (controller/server/worker_checks.h CheckBuffers).
inline constexpr char kPieceRunRowsCapability[] = "piece_run_rows";

// Does any run of `plan`'s buckets have rows (outer_count >= 2)?
bool HasPieceRunRows(const v1::Plan& plan);

// A run's rows (1 without outer_count) and members (count x rows, <= 2^62
// for counts within int32; negative counts count 0).
inline int64_t RunRows(const v1::PieceRun& run) {
  return run.outer_count() <= 0 ? 1 : run.outer_count();
}
inline int64_t RunMembers(const v1::PieceRun& run) {
  return run.count() <= 0 ? 0 : int64_t{run.count()} * RunRows(run);
}

// Checks every run of `bucket` (a plan of `num_names` names), naming the
// bucket and the run (INVALID_ARGUMENT):
//   - count >= 2, outer_count 0 or >= 2;
//   - first carries no reduce_id, quantize_id, scales_of or quant_block;
//   - every stepped value is computed without int64 / int32 overflow at
//     the run's corners (first and last row, first and last member), and
//     names (tensor, src and dst buffers) lie in [0, num_names) there
//     (values are linear in row and member, so the corners bound every
//     member), byte offsets >= 0 there;
//   - the members' packed bytes (dst shape x wire dtype) do not overlap:
//     bucket_step >= one member's wire bytes, outer_bucket_step >= one
//     row's bytes, and the last member ends within `bucket.bytes`.
// Views' extents against their buffers are the binder's checks, made on
// each member as on any piece.
absl::Status CheckPieceRuns(const v1::Bucket& bucket, int32_t num_names);

// The most members all runs of one plan (or plan part) may stand for, in
// all. A run is ~60 bytes on the wire whatever its count, so a reader that
// expands or walks runs bounds its work by this, not by the message size
// (plain pieces: ~0.5 M in a whole Kimi-K2 plan today, far fewer per
// worker part).
inline constexpr int64_t kMaxRunMembers = int64_t{1} << 22;

// CheckPieceRuns on every bucket of `plan` (against its names), and the
// runs' members together at most `max_members` (INVALID_ARGUMENT naming the
// bucket and run where the budget runs out). Readers of a whole plan call
// this once, before ForEachPiece or ExpandRuns on its buckets.
absl::Status CheckPlanRuns(const v1::Plan& plan, int64_t max_members = kMaxRunMembers);

// Plain pieces plus every run's members (INVALID_ARGUMENT on overflow or a
// negative count).
absl::StatusOr<int64_t> PieceCount(const v1::Bucket& bucket);

// Calls fn(index, piece) for each piece of `bucket` in order (index counts
// plain pieces and members alike); stops at, and returns, the first error fn
// returns. A member is written into one reused Piece, valid only during its
// call. Precondition: CheckPieceRuns(bucket, ...) is OK.
absl::Status ForEachPiece(const v1::Bucket& bucket,
                          absl::FunctionRef<absl::Status(int64_t, const v1::Piece&)> fn);

// `bucket` with its runs written out as plain pieces after its own (and no
// runs): for readers that index pieces. Precondition: CheckPieceRuns OK.
v1::Bucket ExpandRuns(const v1::Bucket& bucket);

// Does any bucket of `plan` have runs?
bool HasPieceRuns(const v1::Plan& plan);

// `plan` with every bucket's runs written out (ExpandRuns). Precondition:
// CheckPlanRuns(plan) OK.
v1::Plan ExpandPlanRuns(const v1::Plan& plan);

// A bucket's tensors for messages: the first piece's tensor name (plain or
// the first run's first member) and "and N more pieces" counting members;
// "?" for a bucket without pieces.
std::string BucketPieceNames(const v1::Plan& plan, const v1::Bucket& bucket);

}  // namespace wsync

#endif  // WSYNC_COMMON_PLAN_PIECES_H_
