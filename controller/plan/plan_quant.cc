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
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

using BoxR = ElemBox;

bool Intersect(const BoxR& a, const BoxR& b, BoxR* out) {
  out->rank = a.rank;
  for (int d = 0; d < a.rank; ++d) {
    const int64_t lo = std::max(a.off[d], b.off[d]);
    const int64_t hi = std::min(a.off[d] + a.len[d], b.off[d] + b.len[d]);
    if (hi <= lo) return false;
    out->off[d] = lo;
    out->len[d] = hi - lo;
  }
  return true;
}

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
    bool full = false;
    for (int32_t hg : c.holders) full = full || w->holder_groups[hg].full_count > 0;
    if (!full) {
      const MapEntry& m = w->maps[c.map];
      BoxR r;
      r.rank = rank;
      std::copy(c.off, c.off + rank, r.off);
      std::copy(c.len, c.len + rank, r.len);
      BoxNd b;
      b.offset.assign(r.off, r.off + rank);
      b.length.assign(r.len, r.len + rank);
      return absl::InvalidArgumentError(absl::StrCat(
          "destination tensor '", dt.name, "' region ", b.ToString(),
          " is block-fp8 quantized, but source tensor '", w->src->tensors[m.src_tensor].name,
          "' holds it only as Partial values: reduce-then-quantize is not supported"));
    }
    BoxR t;
    t.rank = rank;
    BlockBoxOf(dt, rank, c.off, c.len, t.off, t.len);
    BoxR in;
    in.rank = rank;
    BoxR ib = t;  // interior in block coordinates
    for (int d = 0; d < rank; ++d) {
      in.off[d] = c.off[d];
      in.len[d] = c.len[d];
    }
    for (int k = 0; k < 2; ++k) {
      const int d = rank - 2 + k;
      const int64_t bs = dt.quant_block[k];
      const int64_t end = c.off[d] + c.len[d];
      const int64_t lo = (c.off[d] + bs - 1) / bs * bs;
      const int64_t hi = end == dt.shape[d] ? end : end / bs * bs;
      in.off[d] = lo;
      in.len[d] = sender_ok ? std::max<int64_t>(0, hi - lo) : 0;
      ib.off[d] = lo / bs;
      ib.len[d] = in.len[d] == 0 ? 0 : (hi + bs - 1) / bs - lo / bs;
    }
    interior[i] = in;
    if (in.Empty()) {
      rem.push_back(t);
      continue;
    }
    // t minus ib: rows above / below ib, then left / right of it.
    const int a = rank - 2, b = rank - 1;
    BoxR x = t;
    x.len[a] = ib.off[a] - t.off[a];
    if (!x.Empty()) rem.push_back(x);
    x = t;
    x.off[a] = ib.off[a] + ib.len[a];
    x.len[a] = t.off[a] + t.len[a] - x.off[a];
    if (!x.Empty()) rem.push_back(x);
    x = t;
    x.off[a] = ib.off[a];
    x.len[a] = ib.len[a];
    x.len[b] = ib.off[b] - t.off[b];
    if (!x.Empty()) rem.push_back(x);
    x.off[b] = ib.off[b] + ib.len[b];
    x.len[b] = t.off[b] + t.len[b] - x.off[b];
    if (!x.Empty()) rem.push_back(x);
  }
  // Disjoint block boxes covering the union of `rem`: the grid of their
  // bounds, keeping the grid cells inside some box.
  const int32_t first_group = static_cast<int32_t>(w->qgroups.size());
  if (!rem.empty()) {
    std::vector<std::vector<int64_t>> cuts(rank);
    for (int d = 0; d < rank; ++d) {
      for (const BoxR& r : rem) {
        cuts[d].push_back(r.off[d]);
        cuts[d].push_back(r.off[d] + r.len[d]);
      }
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    // A region's parts arrive in their source dtypes and share one round on
    // the receiver: keep each region within one working bucket of them.
    int64_t es = 1;
    for (const QuantCandidate& c : *cands) {
      es = std::max(es, DTypeSize(w->src->tensors[w->maps[c.map].src_tensor].dtype));
    }
    // Parts (source dtype) and the forwarded result (fp8 + scales) of a
    // region each fit a working bucket (unless the region is one block).
    const int64_t limit = w->opt.pack_bytes;
    std::vector<size_t> idx(rank, 0);
    std::vector<BoxR> cells;  // grid cells in the union, row-major order
    while (true) {
      BoxR cell;
      cell.rank = rank;
      for (int d = 0; d < rank; ++d) {
        cell.off[d] = cuts[d][idx[d]];
        cell.len[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
      }
      bool in = false;
      for (const BoxR& r : rem) in = in || Inside(r, cell);
      if (in) {
        // Join a cell to the previous one when they are adjacent along one
        // dim and equal in the others (row strips cut by consecutive shard
        // boundaries), up to the limit: fewer, larger regions.
        bool joined = false;
        if (!cells.empty()) {
          BoxR& last = cells.back();
          int along = -1, differ = 0;
          for (int d = 0; d < rank; ++d) {
            if (last.off[d] == cell.off[d] && last.len[d] == cell.len[d]) continue;
            ++differ;
            along = d;
          }
          if (differ == 1 && last.off[along] + last.len[along] == cell.off[along]) {
            BoxR grown = last;
            grown.len[along] += cell.len[along];
            if (BlockBoxBytes(dt, grown, es) <= limit) {
              last = grown;
              joined = true;
            }
          }
        }
        if (!joined) cells.push_back(cell);
      }
      int d = rank - 1;
      while (d >= 0 && ++idx[d] + 1 >= cuts[d].size()) idx[d--] = 0;
      if (d < 0) break;
    }
    std::vector<BoxR> parts;
    for (const BoxR& cell : cells) {
      parts.clear();
      SplitBlocks(dt, cell, limit, es, &parts);
      for (const BoxR& p : parts) {
        const BoxR e = ToElements(dt, p);
        QuantGroup q;
        q.dst_group = gi;
        q.box = w->boxes.Add(rank, e.off, e.len);
        q.rec_begin = static_cast<int32_t>(w->qgroup_recs.size());
        // Forwarding moves whole blocks too: only where one fits a bucket.
        q.rooted = w->opt.relay && g.frag_count > 1 && sender_ok;
        w->qgroup_recs.resize(w->qgroup_recs.size() + g.frag_count, 0);
        w->qgroups.push_back(q);
        if (q.rooted) {
          // The quantized region, forwarded from the root to the others.
          Cell cell;
          cell.map = (*cands)[0].map;
          cell.dst_group = gi;
          cell.box = q.box;
          cell.elems = e.Elems();
          cell.quant = kQuantGroup;
          cell.qgroup = static_cast<int32_t>(w->qgroups.size()) - 1;
          BoxR bb;
          bb.rank = rank;
          BlockBoxOf(dt, rank, e.off, e.len, bb.off, bb.len);
          cell.scales = bb.Elems();
          w->cells.push_back(cell);
        }
      }
    }
  }
  const int32_t end_group = static_cast<int32_t>(w->qgroups.size());
  std::vector<BoxR> parts;
  for (size_t i = 0; i < cands->size(); ++i) {
    const QuantCandidate& c = (*cands)[i];
    const MapEntry& m = w->maps[c.map];
    const int32_t hb = static_cast<int32_t>(w->cell_holders.size());
    w->cell_holders.insert(w->cell_holders.end(), c.holders.begin(), c.holders.end());
    auto add = [&](const BoxR& d, uint8_t quant, int32_t qgroup) {
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
        BoxR bb;
        bb.rank = rank;
        BlockBoxOf(dt, rank, d.off, d.len, bb.off, bb.len);
        cell.scales = bb.Elems();
      }
      w->cells.push_back(cell);
    };
    if (!interior[i].Empty()) {
      BoxR ib;
      ib.rank = rank;
      BlockBoxOf(dt, rank, interior[i].off, interior[i].len, ib.off, ib.len);
      parts.clear();
      SplitBlocks(dt, ib, w->opt.pack_bytes, 1, &parts);
      for (const BoxR& p : parts) add(ToElements(dt, p), kQuantSender, -1);
    }
    BoxR cb;
    cb.rank = rank;
    std::copy(c.off, c.off + rank, cb.off);
    std::copy(c.len, c.len + rank, cb.len);
    for (int32_t q = first_group; q < end_group; ++q) {
      BoxR gbox;
      gbox.rank = rank;
      std::copy(w->boxes.offset(w->qgroups[q].box), w->boxes.offset(w->qgroups[q].box) + rank,
                gbox.off);
      std::copy(w->boxes.length(w->qgroups[q].box), w->boxes.length(w->qgroups[q].box) + rank,
                gbox.len);
      BoxR x;
      if (!Intersect(cb, gbox, &x)) continue;
      // Parts travel in the source dtype: split to the working bucket size.
      const int64_t es = DTypeSize(w->src->tensors[m.src_tensor].dtype);
      parts.clear();
      SplitElemBox(x, std::max<int64_t>(1, w->opt.pack_bytes / es), &parts);
      for (const BoxR& p : parts) add(p, kQuantReceiver, q);
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan::planner_detail
