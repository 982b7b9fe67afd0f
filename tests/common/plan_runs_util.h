// Test oracle for piece runs (common/plan_pieces.h): rewrites a plan's
// buckets so that consecutive pieces laid out alike become PieceRuns, the
// way a compact planner would emit them. Only buckets with no reduce or
// quantize input, scales piece or sender-side quantization are rewritten
// (those index pieces by position).
#ifndef WSYNC_TESTS_COMMON_PLAN_RUNS_UTIL_H_
#define WSYNC_TESTS_COMMON_PLAN_RUNS_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::testing {

// Piece `b` as piece `a` advanced one step: the same but for the stepped
// fields (names, byte offsets, bucket offset).
inline bool SameButStepped(v1::Piece a, v1::Piece b) {
  for (v1::Piece* p : {&a, &b}) {
    p->set_tensor_name(0);
    p->set_bucket_offset(0);
    p->mutable_src()->set_buffer_name(0);
    p->mutable_src()->set_byte_offset(0);
    p->mutable_dst()->set_buffer_name(0);
    p->mutable_dst()->set_byte_offset(0);
  }
  return a.SerializeAsString() == b.SerializeAsString();
}

inline v1::PieceRun RunStartingAt(const v1::Piece& a, const v1::Piece& b) {
  v1::PieceRun r;
  *r.mutable_first() = a;
  r.set_count(2);
  r.set_tensor_name_step(b.tensor_name() - a.tensor_name());
  r.set_src_buffer_step(b.src().buffer_name() - a.src().buffer_name());
  r.set_dst_buffer_step(b.dst().buffer_name() - a.dst().buffer_name());
  r.set_src_byte_step(b.src().byte_offset() - a.src().byte_offset());
  r.set_dst_byte_step(b.dst().byte_offset() - a.dst().byte_offset());
  r.set_bucket_step(b.bucket_offset() - a.bucket_offset());
  return r;
}

// Does `p` continue `r` (is it member r.count())?
inline bool Continues(const v1::PieceRun& r, const v1::Piece& p) {
  const v1::Piece& f = r.first();
  const int64_t k = r.count();
  return SameButStepped(f, p) && p.tensor_name() == f.tensor_name() + k * r.tensor_name_step() &&
         p.src().buffer_name() == f.src().buffer_name() + k * r.src_buffer_step() &&
         p.dst().buffer_name() == f.dst().buffer_name() + k * r.dst_buffer_step() &&
         p.src().byte_offset() == f.src().byte_offset() + k * r.src_byte_step() &&
         p.dst().byte_offset() == f.dst().byte_offset() + k * r.dst_byte_step() &&
         p.bucket_offset() == f.bucket_offset() + k * r.bucket_step();
}

inline bool Runnable(const v1::Bucket& b) {
  if (b.zero_copy()) return false;
  for (const v1::Piece& p : b.pieces()) {
    if (p.reduce_id() != 0 || p.quantize_id() != 0 || p.scales_of() != 0 ||
        p.quant_block_size() != 0) {
      return false;
    }
  }
  return true;
}

// Rewrites every runnable bucket of `plan`; returns the runs made.
inline int CompactRuns(v1::Plan* plan) {
  int made = 0;
  for (v1::Bucket& b : *plan->mutable_buckets()) {
    if (!Runnable(b)) continue;
    std::vector<v1::Piece> plain;
    std::vector<v1::PieceRun> runs;
    const auto& ps = b.pieces();
    for (int i = 0; i < ps.size();) {
      if (i + 1 < ps.size() && SameButStepped(ps[i], ps[i + 1]) &&
          ps[i + 1].bucket_offset() > ps[i].bucket_offset()) {
        v1::PieceRun r = RunStartingAt(ps[i], ps[i + 1]);
        int j = i + 2;
        while (j < ps.size() && Continues(r, ps[j])) {
          r.set_count(r.count() + 1);
          ++j;
        }
        runs.push_back(r);
        i = j;
      } else {
        plain.push_back(ps[i++]);
      }
    }
    if (runs.empty()) continue;
    b.clear_pieces();
    for (v1::Piece& p : plain) *b.add_pieces() = std::move(p);
    for (v1::PieceRun& r : runs) *b.add_runs() = std::move(r);
    made += static_cast<int>(runs.size());
  }
  return made;
}

// Puts every bucket's pieces of `plan` (runs written out first: a plan with
// runs must be ExpandPlanRuns'd) in bucket-offset order (stable), renumbering
// what indexes them (Piece.scales_of, ReduceInput.piece, QuantizeInput.piece).
// The planner packs a bucket's pieces at increasing offsets, so a plan
// without runs is unchanged, and a plan whose runs hold the same pieces
// (members after the bucket's other pieces) becomes equal to it.
inline void CanonicalPieceOrder(v1::Plan* plan) {
  absl::flat_hash_map<int64_t, std::vector<int32_t>> new_index;  // bucket id -> old -> new
  for (v1::Bucket& b : *plan->mutable_buckets()) {
    const int n = b.pieces_size();
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return b.pieces(x).bucket_offset() < b.pieces(y).bucket_offset();
    });
    std::vector<int32_t>& to = new_index[b.id()];
    to.assign(n, 0);
    for (int i = 0; i < n; ++i) to[order[i]] = i;
    std::vector<v1::Piece> sorted(n);
    for (int i = 0; i < n; ++i) sorted[i] = b.pieces(order[i]);
    for (v1::Piece& p : sorted) {
      if (p.scales_of() > 0 && p.scales_of() <= n) p.set_scales_of(to[p.scales_of() - 1] + 1);
    }
    b.clear_pieces();
    for (v1::Piece& p : sorted) *b.add_pieces() = std::move(p);
  }
  auto remap = [&](int64_t bucket, int32_t piece) {
    auto it = new_index.find(bucket);
    if (it == new_index.end() || piece < 0 || piece >= static_cast<int32_t>(it->second.size())) {
      return piece;
    }
    return it->second[piece];
  };
  for (v1::Reduce& r : *plan->mutable_reduces()) {
    for (v1::ReduceInput& in : *r.mutable_inputs()) in.set_piece(remap(in.bucket(), in.piece()));
  }
  for (v1::Quantize& q : *plan->mutable_quantizes()) {
    for (v1::QuantizeInput& in : *q.mutable_inputs()) in.set_piece(remap(in.bucket(), in.piece()));
  }
}

}  // namespace wsync::testing

#endif  // WSYNC_TESTS_COMMON_PLAN_RUNS_UTIL_H_
