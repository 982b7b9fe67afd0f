// Private to the binder's .cc files (bound_plan*.cc): the Binder that turns
// one worker's part of a plan into a BoundPlan, and the view and piece checks
// its Bind* methods share. Everyone else uses BindPlan (bound_plan.h).
#ifndef WSYNC_WORKER_EXEC_BOUND_PLAN_INTERNAL_H_
#define WSYNC_WORKER_EXEC_BOUND_PLAN_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/plan_names.h"
#include "worker/exec/bound_plan.h"

namespace wsync::exec::bind_internal {

// Reorders `out.puts` (and put_origins) by the put phase of the sent bucket
// each came from, stably (a phase keeps round order), and points each sent
// DirectBucket's first_put at its puts' new place. INTERNAL if the sent
// buckets' ranges do not cover every put exactly once (nothing is moved).
absl::Status OrderPutsByPhase(BoundPlan& out);

absl::Status Annotate(const absl::Status& s, const std::string& where);

std::string ShapeString(const v1::TensorView& v);

bool SameShape(const StridedView& a, const StridedView& b);

absl::Status CheckPacked(const v1::Bucket& b, const v1::Piece& p, int64_t numel);

// A piece that its receiver does not write into dst directly (a reduce or
// quantize input): its packed bytes in the round's staging, as a flat view.
absl::Status StagedInput(const v1::Bucket& b, const v1::Piece& p, int64_t transfer_offset,
                         const char* kind, StridedView* view, int64_t* staging_offset);

absl::Status CheckSameCount(const v1::Piece& p);

// A zero-copy bucket is exactly one piece (no runs): checked before its
// pieces are bound, so that one without pieces never moves its bytes from
// a null address.
absl::Status CheckZeroCopyShape(const v1::Bucket& b);

// A row block of a row-major tensor arrives as an N-d view; it is contiguous
// once its dims are merged, so coalesce before judging.
absl::Status CheckZeroCopy(const v1::Bucket& b, StridedView v);

struct QuantGridInfo {
  int64_t outer = 1, rows = 0, cols = 0, block_rows = 0, block_cols = 0;
  int scale_piece = -1;
};

// Piece i of b is sender-quantized: its grid (from its dst shape) and the
// piece carrying its scales.
absl::StatusOr<QuantGridInfo> QuantGrid(const v1::Bucket& b, int i);

absl::Status CheckScalePiece(const v1::Bucket& b, int i);

// The input's box inside its quantization region: shape from the piece's
// dst view (the region's dims); the offset comes from the Quantize.
absl::Status SetPartBox(const v1::Piece& p, QuantizeInput& in);

// The receiver runs no op for directly written bytes: only a plain delivery
// into its destination can skip it.
absl::Status CheckDirectWritable(const v1::Piece& p);

class Binder {
 public:
  Binder(const v1::Plan& plan, int32_t worker, const BufferRegistry& registry, MemorySpace space,
         const DirectWrites* direct)
      : plan_(plan), worker_(worker), registry_(registry), space_(space), direct_(direct) {}

  absl::StatusOr<std::shared_ptr<const BoundPlan>> Bind();

 private:
  struct Partial {
    ReduceInput input;
    std::string where;
    bool consumed = false;
  };

  // Which side's buffer a view names: the view says (a colocated worker has
  // both sides, possibly with the same names; a relay reads a destination
  // buffer), never the op's role.
  static BufferSide SideOf(const v1::TensorView& v) {
    return v.side() == v1::DESTINATION_BUFFER ? BufferSide::kDestination : BufferSide::kSource;
  }

  // role: kDestination for views written (piece / reduce dst), kSource for
  // views read.
  // `peer`: resolve in that peer's buffers (direct writes) instead of ours.
  absl::StatusOr<StridedView> Resolve(const v1::TensorView& v, BufferSide role, const char* which,
                                      const BufferRegistry* peer = nullptr) const;
  // A round's ops by kind, network ones with their transfers (in (peer,
  // seq) order once collected).
  struct RoundOps {
    std::vector<std::pair<BoundTransfer, const v1::Bucket*>> sends, recvs;
    std::vector<const v1::Bucket*> copies;
    std::vector<const v1::Reduce*> reduces;
    std::vector<const v1::Quantize*> quants;
  };
  // Each looks its op's item up and marks it run; errors name `where`.
  absl::StatusOr<const v1::Reduce*> TakeReduce(const v1::Op& op, const std::string& where);
  absl::StatusOr<const v1::Quantize*> TakeQuantize(const v1::Op& op, const std::string& where);
  // Also checks that the bucket belongs to the round and matches the op.
  absl::StatusOr<const v1::Bucket*> TakeBucket(const v1::Op& op, int32_t round,
                                               const std::string& where);
  // A ROUTE_PEER_WRITE bucket: a SEND becomes puts, a RECV runs nothing.
  absl::Status BindPeerWrite(const v1::Op& op, const v1::Bucket& b, int32_t round);
  absl::Status CollectOps(const v1::Round& round, RoundOps& ops);
  // Staging offsets of the round's staged transfers, within the plan's grant.
  absl::Status LayOutStaging(RoundOps& ops, BoundRound& out);
  absl::Status BindOps(RoundOps& ops, BoundRound& out);
  absl::Status BindPut(const v1::Bucket& b, int32_t round, BoundPlan& out);
  // A ROUTE_PEER_WRITE bucket it receives: checked, and its destinations
  // listed for its checksum (BoundPlan::direct_buckets).
  absl::Status BindDirectRecv(const v1::Bucket& b, int32_t round, BoundPlan& out);
  DirectBucket NewDirectBucket(const v1::Bucket& b, int32_t round, bool sent) const;
  // Sorts `d`'s items, checks them (CheckWireHashItems) and adds it.
  absl::Status AddDirectBucket(DirectBucket d, BoundPlan& out);
  std::string Where(int32_t round, const char* op, const v1::Bucket& b) const {
    return absl::StrCat("worker ", worker_, " round ", round, ": ", op, " bucket ", b.id(),
                        " (worker ", b.sender(), " -> ", b.receiver(), ")");
  }
  std::string PieceWhere(const std::string& bucket_where, int i, const v1::Piece& p) const {
    return absl::StrCat(bucket_where, " piece ", i, " (tensor '",
                        PlanNameOrIndex(plan_, p.tensor_name()), "')");
  }

  absl::Status BindRound(const v1::Round& round, BoundRound& out);
  absl::Status BindSend(const v1::Bucket& b, BoundTransfer& t, BoundRound& out);
  absl::Status BindRecv(const v1::Bucket& b, BoundTransfer& t, BoundRound& out,
                        std::map<std::pair<int64_t, int32_t>, Partial>& partials);
  absl::Status BindCopy(const v1::Bucket& b, int32_t round, BoundRound& out,
                        std::map<std::pair<int64_t, int32_t>, Partial>& partials);
  absl::Status BindReduce(const v1::Reduce& r, int32_t round, BoundRound& out,
                          std::map<std::pair<int64_t, int32_t>, Partial>& partials);
  struct QuantPart {
    QuantizeInput input;
    std::string where;
    bool consumed = false;
  };
  absl::Status BindQuantize(const v1::Quantize& q, int32_t round, BoundRound& out);
  std::map<std::pair<int64_t, int32_t>, QuantPart> qparts_;  // this round's inputs
  std::unordered_map<int64_t, const v1::Quantize*> quantizes_;
  std::set<int64_t> seen_quantizes_;

  const v1::Plan& plan_;
  const int32_t worker_;
  const BufferRegistry& registry_;
  const MemorySpace space_;
  const DirectWrites* const direct_;
  BoundPlan* bound_ = nullptr;  // the plan being bound (puts go there)
  std::unordered_map<int64_t, const v1::Bucket*> buckets_;
  std::unordered_map<int64_t, const v1::Reduce*> reduces_;
  std::set<int64_t> seen_buckets_;
  std::set<int64_t> seen_reduces_;
  std::set<int32_t> write_to_;    // receivers of its ROUTE_PEER_WRITE sends
  std::set<int32_t> written_by_;  // senders of its ROUTE_PEER_WRITE receives
};

}  // namespace wsync::exec::bind_internal

#endif  // WSYNC_WORKER_EXEC_BOUND_PLAN_INTERNAL_H_
