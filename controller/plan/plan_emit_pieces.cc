#include "controller/plan/plan_emit_pieces.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/types/span.h"

namespace wsync::plan::planner_detail {
namespace {

bool MergeInto(const Work& w, const Xfer& a, int64_t a_end, MergedPiece* cur, const Xfer& b) {
  if (a.reduce != 0 || b.reduce != 0 || a.quantize != 0 || b.quantize != 0 ||
      w.cells[a.cell].quant != 0 || w.cells[b.cell].quant != 0 || a.relay != b.relay ||
      a.wire != b.wire || a.src_frag != b.src_frag || a.dst_frag != b.dst_frag ||
      b.bucket_offset != a_end) {
    return false;
  }
  const Cell& ca = w.cells[a.cell];
  const Cell& cb = w.cells[b.cell];
  if (ca.map != cb.map || w.boxes.rank(cb.box) != cur->rank) return false;
  const int64_t* bo = w.boxes.offset(cb.box);
  const int64_t* bl = w.boxes.length(cb.box);
  int d = -1;
  for (int k = 0; k < cur->rank; ++k) {
    if (bo[k] == cur->off[k] && bl[k] == cur->len[k]) continue;
    if (d >= 0 || bo[k] != cur->off[k] + cur->len[k]) return false;
    d = k;
  }
  if (d < 0) return false;
  for (int k = 0; k < d; ++k) {
    if (cur->len[k] != 1) return false;
  }
  cur->len[d] += bl[d];
  return true;
}

// The stepped fields of a piece, in PieceRun's step order.
void Stepped(const PieceFields& p, int64_t* v) {
  v[0] = p.tensor_name;
  v[1] = p.src.fields().buffer_name;
  v[2] = p.dst.fields().buffer_name;
  v[3] = p.src.fields().byte_offset;
  v[4] = p.dst.fields().byte_offset;
  v[5] = p.bucket_offset;
}

// Every field of two views but the stepped ones (buffer name, byte offset) equal.
bool AlikeViews(const ViewFields& a, const ViewFields& b) {
  return a.rank == b.rank && a.dtype == b.dtype && a.side == b.side &&
         std::equal(a.shape, a.shape + a.rank, b.shape) &&
         std::equal(a.strides, a.strides + a.rank, b.strides);
}

// Every field but the stepped ones equal.
bool Alike(const PieceFields& a, const PieceFields& b) {
  return a.wire == b.wire && AlikeViews(a.src.fields(), b.src.fields()) &&
         AlikeViews(a.dst.fields(), b.dst.fields());
}

}  // namespace

void MergePieces(const Work& w, const BucketRec& bk, std::vector<MergedPiece>* out) {
  out->clear();
  int64_t end = 0;
  for (int32_t i = 0; i < bk.xfer_count; ++i) {
    const Xfer& x = w.xfers[w.bucket_xfers[bk.xfer_begin + i]];
    if (!out->empty()) {
      MergedPiece& cur = out->back();
      const Xfer& prev = w.xfers[w.bucket_xfers[bk.xfer_begin + i - 1]];
      if (MergeInto(w, prev, end, &cur, x)) {
        ++cur.count;
        end = x.bucket_offset + x.bytes;
        continue;
      }
    }
    MergedPiece p;
    p.first = i;
    p.count = 1;
    const int32_t box = w.cells[x.cell].box;
    p.rank = w.boxes.rank(box);
    std::copy(w.boxes.offset(box), w.boxes.offset(box) + p.rank, p.off);
    std::copy(w.boxes.length(box), w.boxes.length(box) + p.rank, p.len);
    out->push_back(p);
    end = x.bucket_offset + x.bytes;
  }
}

void OwnedViewFields::Set(const ViewFields& f) {
  fields_ = f;
  std::copy(f.shape, f.shape + f.rank, shape_);
  fields_.shape = shape_;
}

void RunGrouper::Reset(int32_t pieces) {
  runs_.clear();
  firsts_.clear();
  run_of_.assign(pieces, -1);
  open_.clear();
}

bool RunGrouper::Continues(int32_t id, const PieceFields& p) const {
  const Run& r = runs_[id];
  const PieceFields& f = *firsts_[id];
  if (!Alike(f, p)) return false;
  int64_t fv[6], pv[6];
  Stepped(f, fv);
  Stepped(p, pv);
  if (r.count == 1) return pv[5] - fv[5] >= f.wire_bytes;  // members never overlap
  for (int i = 0; i < 6; ++i) {
    int64_t by = 0, want = 0;
    if (__builtin_mul_overflow(r.step[i], int64_t{r.count}, &by) ||
        __builtin_add_overflow(fv[i], by, &want) || want != pv[i]) {
      return false;
    }
  }
  return true;
}

void RunGrouper::Add(int32_t index, uint64_t role, const PieceFields* fields) {
  auto it = open_.find(role);
  if (it != open_.end()) {
    Run& r = runs_[it->second];
    if (Continues(it->second, *fields)) {
      if (r.count == 1) {
        int64_t fv[6], pv[6];
        Stepped(*firsts_[it->second], fv);
        Stepped(*fields, pv);
        for (int i = 0; i < 6; ++i) r.step[i] = pv[i] - fv[i];
      }
      ++r.count;
      run_of_[index] = it->second;
      return;
    }
  }
  const int32_t id = static_cast<int32_t>(runs_.size());
  Run r;
  r.first = index;
  r.count = 1;
  runs_.push_back(r);
  firsts_.push_back(fields);
  run_of_[index] = id;
  open_.insert_or_assign(role, id);
}

void RunGrouper::Finish() {
  std::vector<int32_t> renum(runs_.size(), -1);
  int32_t kept = 0;
  for (size_t r = 0; r < runs_.size(); ++r) {
    if (runs_[r].count < 2) continue;
    renum[r] = kept;
    runs_[kept++] = runs_[r];
  }
  runs_.resize(kept);
  firsts_.clear();
  for (int32_t& r : run_of_) {
    if (r >= 0) r = renum[r];
  }
}

void RunGrouper::Dissolve(int32_t r) {
  Run& run = runs_[r];
  for (size_t i = run.first; i < run_of_.size(); ++i) {
    if (run_of_[i] == r) run_of_[i] = -1;
  }
  run.count = 0;
}

bool RunGrouper::Budget(int64_t* members, int64_t max) {
  bool any = false;
  for (int32_t r = 0; r < static_cast<int32_t>(runs_.size()); ++r) {
    if (*members + runs_[r].count > max) {
      Dissolve(r);
      continue;
    }
    *members += runs_[r].count;
    any = true;
  }
  return any;
}

void SetCountAndSteps(const RunGrouper::Run& r, v1::PieceRun* out) {
  out->set_count(r.count);
  out->set_tensor_name_step(static_cast<int32_t>(r.step[0]));
  out->set_src_buffer_step(static_cast<int32_t>(r.step[1]));
  out->set_dst_buffer_step(static_cast<int32_t>(r.step[2]));
  out->set_src_byte_step(r.step[3]);
  out->set_dst_byte_step(r.step[4]);
  out->set_bucket_step(r.step[5]);
}

uint64_t PieceRoles::Of(const Xfer& x, const MergedPiece& mp) {
  if (map_geometry_.empty()) {
    map_geometry_.resize(w_.maps.size());
    for (size_t i = 0; i < w_.maps.size(); ++i) {
      const MapEntry& m = w_.maps[i];
      map_geometry_[i] = absl::HashOf(m.src_rank, m.dst_rank, m.src_offset, m.src_length,
                                      m.dst_offset, m.dst_length);
    }
  }
  return absl::HashOf(map_geometry_[w_.cells[x.cell].map], absl::MakeConstSpan(mp.off, mp.rank),
                      absl::MakeConstSpan(mp.len, mp.rank), x.src_frag, x.dst_frag, x.relay,
                      static_cast<int>(x.wire));
}

}  // namespace wsync::plan::planner_detail
