// Block fp8 destinations, cell level. A candidate region (one map entry x one
// holder set x one DstGroup, destination coordinates) quantizes at the
// sender where it holds whole blocks: its block-aligned interior (a block cut
// only by the tensor edge counts as whole). The blocks it touches but does
// not hold whole are cut by a source boundary (an FSDP row shard through a
// block, a fused part ending mid-block): every holder ships its part in the
// source dtype and the receiver quantizes the block once all parts arrived.
// Those blocks are grouped into disjoint block-aligned QuantGroups (bounded
// so that a group's inputs, which share a round, fit the staging) and every
// candidate is cut along them.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

using BoxR = ElemBox;

bool Inside(const BoxR& outer, const BoxR& inner) {
  for (int d = 0; d < inner.rank; ++d) {
    if (inner.off[d] < outer.off[d] || inner.off[d] + inner.len[d] > outer.off[d] + outer.len[d]) {
      return false;
    }
  }
  return true;
}

// Block coordinates -> element coordinates (clamped at the tensor edge).
BoxR ToElements(const CompiledTensor& t, const BoxR& b) {
  BoxR e = b;
  for (int k = 0; k < 2; ++k) {
    const int d = b.rank - 2 + k;
    const int64_t bs = t.quant_block[k];
    const int64_t lo = b.off[d] * bs;
    const int64_t hi = std::min(t.shape[d], (b.off[d] + b.len[d]) * bs);
    e.off[d] = lo;
    e.len[d] = hi - lo;
  }
  return e;
}

// Bytes of block box `b` (block coordinates) on the wire: the larger of its
// fp8 bytes + fp32 scales and its elements in an `elem_size`-byte source
// dtype (1: fp8 only).
int64_t BlockBoxBytes(const CompiledTensor& t, const BoxR& b, int64_t elem_size) {
  const int64_t elems = ToElements(t, b).Elems();
  return std::max(QuantScaleOffset(elems) + 4 * b.Elems(), elems * elem_size);
}

// Bisects block box `b` along its outermost dim of extent > 1 until each part
// is at most `limit` bytes (BlockBoxBytes) or one block.
void SplitBlocks(const CompiledTensor& t, const BoxR& b, int64_t limit, int64_t elem_size,
                 std::vector<BoxR>* out) {
  if (BlockBoxBytes(t, b, elem_size) <= limit) {
    out->push_back(b);
    return;
  }
  int d = 0;
  while (d < b.rank && b.len[d] == 1) ++d;
  if (d == b.rank) {
    out->push_back(b);
    return;
  }
  BoxR lo = b, hi = b;
  lo.len[d] = b.len[d] / 2;
  hi.off[d] = b.off[d] + lo.len[d];
  hi.len[d] = b.len[d] - lo.len[d];
  SplitBlocks(t, lo, limit, elem_size, out);
  SplitBlocks(t, hi, limit, elem_size, out);
}

void DstToSrc(const MapEntry& m, const BoxR& d, int64_t* soff, int64_t* slen) {
  const int n = std::min(m.src_rank, m.dst_rank);
  const int ls = m.src_rank - n, ld = m.dst_rank - n;
  for (int k = 0; k < ls; ++k) {
    soff[k] = m.src_offset[k];
    slen[k] = 1;
  }
  for (int k = 0; k < n; ++k) {
    soff[ls + k] = d.off[ld + k] - m.dst_offset[ld + k] + m.src_offset[ls + k];
    slen[ls + k] = d.len[ld + k];
  }
}

BoxR BoxOf(int rank, const int64_t* off, const int64_t* len) {
  BoxR b;
  b.rank = rank;
  std::copy(off, off + rank, b.off);
  std::copy(len, len + rank, b.len);
  return b;
}

// Element box `e` of quantized tensor `t` -> the blocks it touches.
BoxR BlocksOf(const CompiledTensor& t, const BoxR& e) {
  BoxR b;
  b.rank = e.rank;
  BlockBoxOf(t, e.rank, e.off, e.len, b.off, b.len);
  return b;
}

// Quantizing needs the values themselves: fails when no holder of `c` holds
// it whole (only Partial values, which would need reduce-then-quantize).
absl::Status CheckHeldWhole(const Work& w, const CompiledTensor& dt, const QuantCandidate& c,
                            int rank) {
  for (int32_t hg : c.holders) {
    if (w.holder_groups[hg].full_count > 0) return absl::OkStatus();
  }
  const MapEntry& m = w.maps[c.map];
  BoxNd b;
  b.offset.assign(c.off, c.off + rank);
  b.length.assign(c.len, c.len + rank);
  return absl::InvalidArgumentError(absl::StrCat(
      "destination tensor '", dt.name, "' region ", b.ToString(),
      " is block-fp8 quantized, but source tensor '", w.src->tensors[m.src_tensor].name,
      "' holds it only as Partial values: reduce-then-quantize is not supported"));
}

// The part of candidate `c` (touching blocks `t`) that quantizes at the
// sender: its block-aligned interior, `in` in element and `ib` in block
// coordinates; empty when sender-side quantization is off (!sender_ok).
void SenderInterior(const CompiledTensor& dt, const QuantCandidate& c, const BoxR& t,
                    bool sender_ok, BoxR* in, BoxR* ib) {
  const int rank = t.rank;
  *in = BoxOf(rank, c.off, c.len);
  *ib = t;
  for (int k = 0; k < 2; ++k) {
    const int d = rank - 2 + k;
    const int64_t bs = dt.quant_block[k];
    const int64_t end = c.off[d] + c.len[d];
    const int64_t lo = (c.off[d] + bs - 1) / bs * bs;
    const int64_t hi = end == dt.shape[d] ? end : end / bs * bs;
    in->off[d] = lo;
    in->len[d] = sender_ok ? std::max<int64_t>(0, hi - lo) : 0;
    ib->off[d] = lo / bs;
    ib->len[d] = in->len[d] == 0 ? 0 : (hi + bs - 1) / bs - lo / bs;
  }
}

// Appends block box `t` minus its interior `ib` (inside it) to `rem`: the
// rows above / below ib, then left / right of it.
void AppendRim(const BoxR& t, const BoxR& ib, std::vector<BoxR>* rem) {
  const int a = t.rank - 2, b = t.rank - 1;
  BoxR x = t;
  x.len[a] = ib.off[a] - t.off[a];
  if (!x.Empty()) rem->push_back(x);
  x = t;
  x.off[a] = ib.off[a] + ib.len[a];
  x.len[a] = t.off[a] + t.len[a] - x.off[a];
  if (!x.Empty()) rem->push_back(x);
  x = t;
  x.off[a] = ib.off[a];
  x.len[a] = ib.len[a];
  x.len[b] = ib.off[b] - t.off[b];
  if (!x.Empty()) rem->push_back(x);
  x.off[b] = ib.off[b] + ib.len[b];
  x.len[b] = t.off[b] + t.len[b] - x.off[b];
  if (!x.Empty()) rem->push_back(x);
}

// The largest source element size among the candidates' tensors: a
// region's parts arrive in their source dtypes and share one round on the
// receiver, so each region stays within one working bucket of them.
int64_t WidestSourceBytes(const Work& w, const std::vector<QuantCandidate>& cands) {
  int64_t es = 1;
  for (const QuantCandidate& c : cands) {
    es = std::max(es, DTypeSize(w.src->tensors[w.maps[c.map].src_tensor].dtype));
  }
  return es;
}

// Appends grid cell `cell` to `cells`, or joins it to the last one when they
// are adjacent along one dim and equal in the others (row strips cut by
// consecutive shard boundaries) and the joined box stays within `limit`
// bytes: fewer, larger regions.
void JoinOrAppend(const CompiledTensor& dt, const BoxR& cell, int64_t limit, int64_t es,
                  std::vector<BoxR>* cells) {
  if (!cells->empty()) {
    BoxR& last = cells->back();
    int along = -1, differ = 0;
    for (int d = 0; d < cell.rank; ++d) {
      if (last.off[d] == cell.off[d] && last.len[d] == cell.len[d]) continue;
      ++differ;
      along = d;
    }
    if (differ == 1 && last.off[along] + last.len[along] == cell.off[along]) {
      BoxR grown = last;
      grown.len[along] += cell.len[along];
      if (BlockBoxBytes(dt, grown, es) <= limit) {
        last = grown;
        return;
      }
    }
  }
  cells->push_back(cell);
}

// Disjoint block boxes covering the union of `rem` (non-empty): the grid of
// their bounds, keeping the grid cells inside some box, in row-major order,
// joined along a dim where they stay within `limit` bytes.
std::vector<BoxR> CoverBlocks(const CompiledTensor& dt, const std::vector<BoxR>& rem, int64_t limit,
                              int64_t es) {
  const int rank = rem[0].rank;
  std::vector<std::vector<int64_t>> cuts(rank);
  for (int d = 0; d < rank; ++d) {
    for (const BoxR& r : rem) {
      cuts[d].push_back(r.off[d]);
      cuts[d].push_back(r.off[d] + r.len[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<size_t> idx(rank, 0);
  std::vector<BoxR> cells;
  while (true) {
    BoxR cell;
    cell.rank = rank;
    for (int d = 0; d < rank; ++d) {
      cell.off[d] = cuts[d][idx[d]];
      cell.len[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
    }
    bool in = false;
    for (const BoxR& r : rem) in = in || Inside(r, cell);
    if (in) JoinOrAppend(dt, cell, limit, es, &cells);
    int d = rank - 1;
    while (d >= 0 && ++idx[d] + 1 >= cuts[d].size()) idx[d--] = 0;
    if (d < 0) break;
  }
  return cells;
}

// One QuantGroup per part of each covering block box (split to `limit`
// bytes); a rooted group (relay on, several fragments, sender-side blocks
// fit a bucket) also gets the cell forwarding the quantized region from its
// root to the others.
void AddQuantGroups(Work* w, int32_t gi, int32_t map, const std::vector<BoxR>& cells, int64_t limit,
                    int64_t es, bool sender_ok) {
  const DstGroup& g = w->dst_groups[gi];
  const CompiledTensor& dt = w->dst->tensors[g.dst_tensor];
  std::vector<BoxR> parts;
  for (const BoxR& cell : cells) {
    parts.clear();
    SplitBlocks(dt, cell, limit, es, &parts);
    for (const BoxR& p : parts) {
      const BoxR e = ToElements(dt, p);
      QuantGroup q;
      q.dst_group = gi;
      q.box = w->boxes.Add(e.rank, e.off, e.len);
      q.rec_begin = static_cast<int32_t>(w->qgroup_recs.size());
      // Forwarding moves whole blocks too: only where one fits a bucket.
      q.rooted = w->opt.relay && g.frag_count > 1 && sender_ok;
      w->qgroup_recs.resize(w->qgroup_recs.size() + g.frag_count, 0);
      w->qgroups.push_back(q);
      if (!q.rooted) continue;
      Cell fwd;
      fwd.map = map;
      fwd.dst_group = gi;
      fwd.box = q.box;
      fwd.elems = e.Elems();
      fwd.quant = kQuantGroup;
      fwd.qgroup = static_cast<int32_t>(w->qgroups.size()) - 1;
      fwd.scales = BlocksOf(dt, e).Elems();
      w->cells.push_back(fwd);
    }
  }
}

// Appends the cell of candidate `c` for destination box `d` (element
// coordinates), held by the holder sets from `hb` on.
void AddCandidateCell(Work* w, int32_t gi, const QuantCandidate& c, int32_t hb, const BoxR& d,
                      uint8_t quant, int32_t qgroup) {
  const MapEntry& m = w->maps[c.map];
  Cell cell;
  cell.map = c.map;
  cell.dst_group = gi;
  int64_t soff[kMaxDims], slen[kMaxDims];
  DstToSrc(m, d, soff, slen);
  cell.box = w->boxes.Add(m.src_rank, soff, slen);
  cell.hg_begin = hb;
  cell.hg_count = static_cast<int32_t>(c.holders.size());
  cell.elems = d.Elems();
  cell.quant = quant;
  cell.qgroup = qgroup;
  if (quant == kQuantSender) {
    cell.scales = BlocksOf(w->dst->tensors[w->dst_groups[gi].dst_tensor], d).Elems();
  }
  w->cells.push_back(cell);
}

// The cells of candidate `c`: its sender-quantized `interior` (split to the
// working bucket), then its part of every QuantGroup in [first_group,
// end_group) (source dtype, split to the working bucket).
void EmitCandidateCells(Work* w, int32_t gi, const QuantCandidate& c, const BoxR& interior,
                        int32_t first_group, int32_t end_group, std::vector<BoxR>* parts) {
  const CompiledTensor& dt = w->dst->tensors[w->dst_groups[gi].dst_tensor];
  const int rank = static_cast<int>(dt.shape.size());
  const MapEntry& m = w->maps[c.map];
  const int32_t hb = static_cast<int32_t>(w->cell_holders.size());
  w->cell_holders.insert(w->cell_holders.end(), c.holders.begin(), c.holders.end());
  if (!interior.Empty()) {
    parts->clear();
    SplitBlocks(dt, BlocksOf(dt, interior), w->opt.pack_bytes, 1, parts);
    for (const BoxR& p : *parts) {
      AddCandidateCell(w, gi, c, hb, ToElements(dt, p), kQuantSender, -1);
    }
  }
  const BoxR cb = BoxOf(rank, c.off, c.len);
  const int64_t es = DTypeSize(w->src->tensors[m.src_tensor].dtype);
  for (int32_t q = first_group; q < end_group; ++q) {
    const int32_t box = w->qgroups[q].box;
    BoxR x;
    if (!IntersectElemBox(cb, w->boxes.offset(box), w->boxes.length(box), &x)) continue;
    parts->clear();
    SplitElemBox(x, std::max<int64_t>(1, w->opt.pack_bytes / es), parts);
    for (const BoxR& p : *parts) AddCandidateCell(w, gi, c, hb, p, kQuantReceiver, q);
  }
}

}  // namespace

void BlockBoxOf(const CompiledTensor& t, int rank, const int64_t* off, const int64_t* len,
                int64_t* boff, int64_t* blen) {
  for (int d = 0; d < rank; ++d) {
    boff[d] = off[d];
    blen[d] = len[d];
  }
  for (int k = 0; k < 2; ++k) {
    const int d = rank - 2 + k;
    const int64_t bs = t.quant_block[k];
    boff[d] = off[d] / bs;
    blen[d] = (off[d] + len[d] + bs - 1) / bs - boff[d];
  }
}

int64_t CellWireBytes(const Work& w, const Cell& c, v1::DType wire) {
  if (CarriesScales(c)) return QuantScaleOffset(c.elems) + c.scales * 4;
  return c.elems * DTypeSize(wire);
}

absl::Status EmitQuantCells(Work* w, int32_t gi, std::vector<QuantCandidate>* cands) {
  const DstGroup& g = w->dst_groups[gi];
  const CompiledTensor& dt = w->dst->tensors[g.dst_tensor];
  const int rank = static_cast<int>(dt.shape.size());
  // A sender-side delivery is at least one block (fp8 + its scale); blocks
  // too big for a bucket are quantized at the receiver, whose parts split.
  const bool sender_ok =
      QuantScaleOffset(dt.quant_block[0] * dt.quant_block[1]) + 4 <= w->opt.bucket_bytes;
  // Interior (element coordinates) and the blocks touched but not held whole.
  std::vector<BoxR> interior(cands->size());
  std::vector<BoxR> rem;
  for (size_t i = 0; i < cands->size(); ++i) {
    const QuantCandidate& c = (*cands)[i];
    RETURN_IF_ERROR(CheckHeldWhole(*w, dt, c, rank));
    const BoxR t = BlocksOf(dt, BoxOf(rank, c.off, c.len));
    BoxR ib;
    SenderInterior(dt, c, t, sender_ok, &interior[i], &ib);
    if (interior[i].Empty()) {
      rem.push_back(t);
    } else {
      AppendRim(t, ib, &rem);
    }
  }
  const int32_t first_group = static_cast<int32_t>(w->qgroups.size());
  if (!rem.empty()) {
    // Parts (source dtype) and the forwarded result (fp8 + scales) of a
    // region each fit a working bucket (unless the region is one block).
    const int64_t limit = w->opt.pack_bytes;
    const int64_t es = WidestSourceBytes(*w, *cands);
    AddQuantGroups(w, gi, (*cands)[0].map, CoverBlocks(dt, rem, limit, es), limit, es, sender_ok);
  }
  const int32_t end_group = static_cast<int32_t>(w->qgroups.size());
  std::vector<BoxR> parts;
  for (size_t i = 0; i < cands->size(); ++i) {
    EmitCandidateCells(w, gi, (*cands)[i], interior[i], first_group, end_group, &parts);
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan::planner_detail
