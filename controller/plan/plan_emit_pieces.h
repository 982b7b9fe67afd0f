// Stage 9's pieces (plan_emit.cc): the transfers of a bucket merged into
// pieces, and the pieces grouped into PieceRuns (docs/plan-compact.md).
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_EMIT_PIECES_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_EMIT_PIECES_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "controller/plan/plan_views.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {

// One emitted piece: a run of transfers of one bucket merged into one box.
// Consecutive transfers merge when they read the same fragment, write the
// same fragment, lie back to back in the bucket and their boxes join along
// one dim with every dim before it of length 1 (so the union, packed row
// major, is the first box's bytes followed by the second's). Replicated
// destinations fed from many row blocks otherwise cost one piece per block
// per relay hop, which dominated plan time and memory for FSDP sources.
struct MergedPiece {
  int32_t first = 0;  // index into the bucket's transfers
  int32_t count = 0;
  int rank = 0;
  int64_t off[kMaxDims];
  int64_t len[kMaxDims];
};

// Pieces of bucket `bk` (appended to `out`, which is cleared first).
void MergePieces(const Work& w, const BucketRec& bk, std::vector<MergedPiece>* out);

// One side's view of a piece, owning its shape: `fields().shape` points at
// this object's own copy (a copy or assignment points at its own), the
// strides into compiled fragments.
class OwnedViewFields {
 public:
  OwnedViewFields() = default;
  OwnedViewFields(const OwnedViewFields& other) { Set(other.fields_); }
  OwnedViewFields& operator=(const OwnedViewFields& other) {
    Set(other.fields_);
    return *this;
  }
  // `f`, its shape copied here (f.rank <= kMaxDims).
  void Set(const ViewFields& f);
  const ViewFields& fields() const { return fields_; }

 private:
  ViewFields fields_;
  int64_t shape_[kMaxDims] = {};
};

// A plain piece's fields as the emitter writes them (no reduce, quantize or
// scales: those pieces never join a run).
struct PieceFields {
  int32_t tensor_name = 0;
  int64_t bucket_offset = 0;
  // The source view is on the destination side for a relay (src.side).
  OwnedViewFields src, dst;
  v1::DType wire = v1::DTYPE_UNSPECIFIED;
  int64_t wire_bytes = 0;

  bool relay() const { return src.fields().side == v1::DESTINATION_BUFFER; }
};

// Groups the plain pieces of one bucket into runs. Pieces come in the
// bucket's order, each with a `role`: a hash of what the planner knows makes
// pieces alike (the mapping's geometry, the box in the tensor, the
// fragments read and written, relay, wire dtype), so that interleaved
// sequences (gate and up projections of consecutive experts packed in
// turn) each form their own run. The role only picks the run a piece may
// continue; joining is decided on the fields alone: a piece continues a run
// iff every field but the stepped ones (names, byte offsets, bucket offset)
// equals the run's first piece's and the stepped ones are first + k x step.
// So every run the grouper forms expands to exactly the pieces it was given.
class RunGrouper {
 public:
  struct Run {
    int32_t first = 0;  // index of the first member among the bucket's pieces
    int32_t count = 0;
    int64_t step[6] = {0, 0, 0, 0, 0, 0};  // tensor, src/dst buffer, src/dst byte, bucket
  };

  // Starts a bucket of `pieces` pieces (indices 0..pieces-1).
  void Reset(int32_t pieces);
  // Piece `index` (increasing), a run candidate; `fields` must outlive
  // the bucket (the grouper keeps a pointer to each run's first).
  void Add(int32_t index, uint64_t role, const PieceFields* fields);
  // Ends the bucket: runs of one member are dropped. Then run_of(i) is the
  // run piece i belongs to (-1: plain) and runs() the runs, by first member.
  void Finish();
  // Writes runs()[r]'s members out as plain pieces.
  void Dissolve(int32_t r);
  // Keeps runs while *members (the plan's run members so far) + their count
  // stays within `max` (adding them to *members), dissolving the others;
  // true if any run is kept.
  bool Budget(int64_t* members, int64_t max);
  int32_t run_of(int32_t index) const { return run_of_[index]; }
  const std::vector<Run>& runs() const { return runs_; }

 private:
  bool Continues(int32_t run, const PieceFields& p) const;

  std::vector<Run> runs_;
  std::vector<const PieceFields*> firsts_;  // per run
  std::vector<int32_t> run_of_;
  absl::flat_hash_map<uint64_t, int32_t> open_;  // role -> its latest run
};

// Run r's count and steps into `out`.
void SetCountAndSteps(const RunGrouper::Run& r, v1::PieceRun* out);

// The role (RunGrouper::Add) of a plain piece: a hash of its mapping
// entry's geometry (the members of a tensor class have entries alike), its
// box in the source tensor, the fragments it reads and writes, relay and
// wire dtype.
class PieceRoles {
 public:
  explicit PieceRoles(const Work& w) : w_(w) {}
  uint64_t Of(const Xfer& x, const MergedPiece& mp);

 private:
  const Work& w_;
  std::vector<uint64_t> map_geometry_;  // per MapEntry, on first use
};

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_EMIT_PIECES_H_
