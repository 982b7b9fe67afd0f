// The replay oracle's structural check of a plan (CheckPlanStructure).
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/bucket_steps.h"
#include "common/dtype.h"
#include "common/plan_names.h"
#include "common/status_macros.h"
#include "controller/verify/replay_internal.h"

namespace wsync::plan::replay_detail {
namespace {

bool ContiguousView(const v1::TensorView& v) {
  int64_t expect = 1;
  for (int d = v.shape_size() - 1; d >= 0; --d) {
    if (v.shape(d) == 1) continue;
    if (v.strides(d) != expect) return false;
    expect *= v.shape(d);
  }
  return true;
}

// The plan's reduces and quantizes by id, and how many ops name each bucket
// (by kind), reduce and quantize.
struct OpCensus {
  explicit OpCensus(const v1::Plan& plan)
      : sends(plan.buckets_size(), 0),
        recvs(plan.buckets_size(), 0),
        copies(plan.buckets_size(), 0),
        reduce_ops(plan.reduces_size(), 0),
        quant_ops(plan.quantizes_size(), 0) {
    for (int i = 0; i < plan.reduces_size(); ++i) reduce_index[plan.reduces(i).id()] = i;
    for (int i = 0; i < plan.quantizes_size(); ++i) quant_index[plan.quantizes(i).id()] = i;
  }

  absl::flat_hash_map<int64_t, int> reduce_index;
  absl::flat_hash_map<int64_t, int> quant_index;
  std::vector<int> sends, recvs, copies, reduce_ops, quant_ops;
};

// Bucket i: dense id, round in range, transport agrees with its ends, ids
// ordered by (round, sender, receiver) so that seq is a running count.
absl::Status CheckBucketOrder(const v1::Plan& plan, int i, const std::string& what) {
  const v1::Bucket& b = plan.buckets(i);
  if (b.id() != i) return absl::InvalidArgumentError(absl::StrCat(what, ": ids not dense"));
  if (b.round() < 0 || b.round() >= plan.num_rounds()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": round ", b.round(), " out of range"));
  }
  if ((b.transport() == v1::TRANSPORT_LOCAL) != (b.sender() == b.receiver())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": transport contradicts sender/receiver"));
  }
  const int32_t max_step = b.transport() == v1::TRANSPORT_LOCAL ? 0 : kMaxBucketSteps - 1;
  if (b.step() < 0 || b.step() > max_step) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": step ", b.step(), " outside [0, ", max_step, "]"));
  }
  if (i == 0) {
    if (b.seq() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": seq ", b.seq(), " wrong"));
    }
    return absl::OkStatus();
  }
  const v1::Bucket& p = plan.buckets(i - 1);
  const bool same =
      p.sender() == b.sender() && p.receiver() == b.receiver() && p.round() == b.round();
  if (std::make_tuple(p.round(), p.sender(), p.receiver()) >
      std::make_tuple(b.round(), b.sender(), b.receiver())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": buckets not ordered by round"));
  }
  if (b.seq() != (same ? p.seq() + 1 : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": seq ", b.seq(), " wrong"));
  }
  return absl::OkStatus();
}

// Piece k's values: a scale piece names a quantized piece of the bucket and
// holds one fp32 scale per block; any other piece has as many source as
// destination elements; a quantized piece travels as fp8 with one scale piece.
absl::Status CheckPieceValues(const v1::Bucket& b, int k, const std::string& what) {
  const v1::Piece& p = b.pieces(k);
  const int64_t n = ViewElems(p.dst());
  if (p.scales_of() != 0) {
    // Scales computed by another piece of the bucket: no src to read.
    const int q = p.scales_of() - 1;
    if (q < 0 || q >= b.pieces_size() || b.pieces(q).quant_block_size() == 0 ||
        p.wire_dtype() != v1::FP32 || p.dst().dtype() != v1::FP32) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " piece ", k, ": scales_of names no quantized piece, or not fp32"));
    }
    ASSIGN_OR_RETURN(BlockGrid g, GridOf(b.pieces(q).dst().shape(), b.pieces(q).quant_block(),
                                         absl::StrCat(what, " piece ", q)));
    if (g.num_blocks() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " piece ", k, ": ", n, " scales for ", g.num_blocks(), " blocks"));
    }
  } else if (ViewElems(p.src()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " piece ", k, ": src and dst sizes differ"));
  }
  if (p.quant_block_size() == 0) return absl::OkStatus();
  int scale_pieces = 0;
  for (const v1::Piece& o : b.pieces()) scale_pieces += o.scales_of() == k + 1;
  if (p.wire_dtype() != v1::FP8_E4M3 || scale_pieces != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " piece ", k, ": a quantized piece needs wire FP8_E4M3 and one scale piece"));
  }
  return GridOf(p.dst().shape(), p.quant_block(), absl::StrCat(what, " piece ", k)).status();
}

// A piece feeding a quantize (or reduce) names a known one that runs on the
// bucket's receiver in the bucket's round.
absl::Status CheckPieceQuantize(const v1::Plan& plan, const OpCensus& census, const v1::Bucket& b,
                                int k, const std::string& what) {
  const v1::Piece& p = b.pieces(k);
  if (p.quantize_id() == 0) return absl::OkStatus();
  auto it = census.quant_index.find(p.quantize_id());
  if (it == census.quant_index.end() || p.reduce_id() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " piece ", k, ": unknown quantize ", p.quantize_id()));
  }
  const v1::Quantize& q = plan.quantizes(it->second);
  if (q.round() != b.round() || q.worker() != b.receiver()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " piece ", k, ": quantize ", q.id(),
                                                   " runs in another round or worker"));
  }
  return absl::OkStatus();
}

absl::Status CheckPieceReduce(const v1::Plan& plan, const OpCensus& census, const v1::Bucket& b,
                              int k, const std::string& what) {
  const v1::Piece& p = b.pieces(k);
  if (p.reduce_id() == 0) return absl::OkStatus();
  auto it = census.reduce_index.find(p.reduce_id());
  if (it == census.reduce_index.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " piece ", k, ": unknown reduce ", p.reduce_id()));
  }
  const v1::Reduce& r = plan.reduces(it->second);
  if (r.round() != b.round() || r.worker() != b.receiver()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " piece ", k, ": reduce ", r.id(), " runs in another round or worker"));
  }
  return absl::OkStatus();
}

// Every piece of bucket b is well-formed and inside the bucket; no two overlap.
absl::Status CheckBucketPieces(const v1::Plan& plan, const OpCensus& census, const v1::Bucket& b,
                               const std::string& what) {
  if (b.runs_size() > 0) {  // a check that skipped them would pass bytes it never saw
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", b.runs_size(), " piece runs not written out (ReplayPlan expands them)"));
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (int k = 0; k < b.pieces_size(); ++k) {
    const v1::Piece& p = b.pieces(k);
    RETURN_IF_ERROR(CheckPieceValues(b, k, what));
    RETURN_IF_ERROR(CheckPieceQuantize(plan, census, b, k, what));
    const int64_t bytes = ViewElems(p.dst()) * DTypeSize(p.wire_dtype());
    if (p.bucket_offset() < 0 || p.bucket_offset() + bytes > b.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " piece ", k, " (tensor '",
                                                     PlanNameOrIndex(plan, p.tensor_name()),
                                                     "') outside the bucket"));
    }
    spans.emplace_back(p.bucket_offset(), p.bucket_offset() + bytes);
    RETURN_IF_ERROR(CheckPieceReduce(plan, census, b, k, what));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].first < spans[k - 1].second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": pieces overlap in the bucket"));
    }
  }
  return absl::OkStatus();
}

// A zero-copy bucket is one uncast piece, contiguous on both ends, at 0.
absl::Status CheckZeroCopy(const v1::Bucket& b, const std::string& what) {
  if (!b.zero_copy()) return absl::OkStatus();
  if (b.pieces_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zero-copy with ", b.pieces_size(), " pieces"));
  }
  const v1::Piece& p = b.pieces(0);
  if (p.wire_dtype() != p.src().dtype() || p.wire_dtype() != p.dst().dtype() ||
      !ContiguousView(p.src()) || !ContiguousView(p.dst()) || p.bucket_offset() != 0 ||
      p.reduce_id() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zero-copy piece is cast or not contiguous"));
  }
  return absl::OkStatus();
}

// Staged bytes per (worker, round): both ends of every staged network bucket.
std::map<std::pair<int32_t, int32_t>, int64_t> StagingBytes(const v1::Plan& plan) {
  std::map<std::pair<int32_t, int32_t>, int64_t> staging;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.transport() == v1::TRANSPORT_LOCAL || b.zero_copy()) continue;
    staging[{b.sender(), b.round()}] += b.bytes();
    staging[{b.receiver(), b.round()}] += b.bytes();
  }
  return staging;
}

using OpKey = std::tuple<int, int32_t, int32_t, int64_t>;

// A SEND, RECV or COPY op of worker rp in round `round` matches its bucket;
// counts it and sets its sort key (transfers by peer and seq, then copies).
absl::Status CheckBucketOp(const v1::Plan& plan, const v1::RankPlan& rp, int32_t round,
                           const v1::Op& op, const std::string& where, OpCensus* census,
                           OpKey* key) {
  if (op.bucket() < 0 || op.bucket() >= plan.buckets_size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown bucket ", op.bucket()));
  }
  const v1::Bucket& b = plan.buckets(op.bucket());
  bool ok = b.round() == round;
  if (op.kind() == v1::Op::SEND) {
    ok = ok && b.sender() == rp.worker() && op.peer() == b.receiver() && b.sender() != b.receiver();
    ++census->sends[op.bucket()];
    *key = {0, op.peer(), b.seq(), 0};
  } else if (op.kind() == v1::Op::RECV) {
    ok = ok && b.receiver() == rp.worker() && op.peer() == b.sender() && b.sender() != b.receiver();
    ++census->recvs[op.bucket()];
    *key = {0, op.peer(), b.seq(), 1};
  } else {
    ok = ok && b.sender() == rp.worker() && b.receiver() == rp.worker();
    ++census->copies[op.bucket()];
    *key = {1, 0, 0, op.bucket()};
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": op on bucket ", op.bucket(), " does not match it"));
  }
  return absl::OkStatus();
}

// Any op of worker rp in round `round`: a REDUCE or QUANTIZE runs there;
// counts it and sets its sort key.
absl::Status CheckOp(const v1::Plan& plan, const v1::RankPlan& rp, int32_t round, const v1::Op& op,
                     const std::string& where, OpCensus* census, OpKey* key) {
  if (op.kind() == v1::Op::REDUCE) {
    auto it = census->reduce_index.find(op.reduce());
    if (it == census->reduce_index.end() || plan.reduces(it->second).worker() != rp.worker() ||
        plan.reduces(it->second).round() != round) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bad REDUCE ", op.reduce()));
    }
    ++census->reduce_ops[it->second];
    *key = {2, 0, 0, op.reduce()};
    return absl::OkStatus();
  }
  if (op.kind() == v1::Op::QUANTIZE) {
    auto it = census->quant_index.find(op.quantize());
    if (it == census->quant_index.end() || plan.quantizes(it->second).worker() != rp.worker() ||
        plan.quantizes(it->second).round() != round) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bad QUANTIZE ", op.quantize()));
    }
    ++census->quant_ops[it->second];
    *key = {3, 0, 0, op.quantize()};
    return absl::OkStatus();
  }
  return CheckBucketOp(plan, rp, round, op, where, census, key);
}

// Worker rp's rounds: ascending, in range, non-empty, staging_bytes right,
// ops valid and in order.
absl::Status CheckRankRounds(const v1::Plan& plan,
                             const std::map<std::pair<int32_t, int32_t>, int64_t>& staging,
                             const v1::RankPlan& rp, OpCensus* census) {
  int32_t last_round = -1;
  for (const v1::Round& round : rp.rounds()) {
    const std::string where = absl::StrCat("worker ", rp.worker(), " round ", round.index());
    if (round.index() <= last_round || round.index() >= plan.num_rounds()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rounds out of order or range"));
    }
    last_round = round.index();
    if (round.ops_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty round"));
    }
    auto st = staging.find({rp.worker(), round.index()});
    if (round.staging_bytes() != (st == staging.end() ? 0 : st->second)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": staging_bytes ", round.staging_bytes(), " wrong"));
    }
    OpKey prev(-1, 0, 0, 0);
    for (const v1::Op& op : round.ops()) {
      OpKey key;
      RETURN_IF_ERROR(CheckOp(plan, rp, round.index(), op, where, census, &key));
      if (key < prev) return absl::InvalidArgumentError(absl::StrCat(where, ": ops out of order"));
      prev = key;
    }
  }
  return absl::OkStatus();
}

// Every bucket has one SEND and one RECV (a local one one COPY); every
// reduce and quantize exactly one op.
absl::Status CheckOpCounts(const v1::Plan& plan, const OpCensus& census) {
  for (int i = 0; i < plan.buckets_size(); ++i) {
    const v1::Bucket& b = plan.buckets(i);
    const bool local = b.sender() == b.receiver();
    if (local ? census.copies[i] != 1 || census.sends[i] || census.recvs[i]
              : census.sends[i] != 1 || census.recvs[i] != 1 || census.copies[i]) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", i, ": wrong number of ops"));
    }
  }
  for (int i = 0; i < plan.reduces_size(); ++i) {
    if (census.reduce_ops[i] != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce ", plan.reduces(i).id(), ": wrong number of ops"));
    }
  }
  for (int i = 0; i < plan.quantizes_size(); ++i) {
    if (census.quant_ops[i] != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("quantize ", plan.quantizes(i).id(), ": wrong number of ops"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPlanStructure(const v1::Plan& plan) {
  OpCensus census(plan);
  for (int i = 0; i < plan.buckets_size(); ++i) {
    const v1::Bucket& b = plan.buckets(i);
    const std::string what = absl::StrCat("bucket ", b.id());
    RETURN_IF_ERROR(CheckBucketOrder(plan, i, what));
    RETURN_IF_ERROR(CheckBucketPieces(plan, census, b, what));
    RETURN_IF_ERROR(CheckZeroCopy(b, what));
  }
  const auto staging = StagingBytes(plan);
  for (const v1::RankPlan& rp : plan.ranks()) {
    RETURN_IF_ERROR(CheckRankRounds(plan, staging, rp, &census));
  }
  return CheckOpCounts(plan, census);
}

}  // namespace wsync::plan::replay_detail
