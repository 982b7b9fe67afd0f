// Stage 2: destination regions -> source cells. Destination fragments with an
// identical box (replicas of an inference engine) share one DstGroup, so the
// intersection work is done once per unique box. Source holder groups are
// found through their index (plan_holders.cc): by binary search, never by an
// all-pairs scan.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

using Region = ElemBox;

bool Overlap(const Region& a, const Region& b) {
  for (int d = 0; d < a.rank; ++d) {
    if (std::max(a.off[d], b.off[d]) >= std::min(a.off[d] + a.len[d], b.off[d] + b.len[d])) {
      return false;
    }
  }
  return true;
}

BoxNd ToBox(const Region& r) {
  BoxNd b;
  b.offset.assign(r.off, r.off + r.rank);
  b.length.assign(r.len, r.len + r.rank);
  return b;
}

}  // namespace

void BuildDstGroups(Work* w) {
  for (size_t t = 0; t < w->dst->tensors.size(); ++t) {
    const CompiledTensor& ct = w->dst->tensors[t];
    if (ct.scales_for >= 0) continue;  // written by quantization, fed by no mapping
    const bool scalar = ct.shape.empty();
    for (size_t f = 0; f < ct.num_fragments();) {
      size_t e = f + 1;
      while (e < ct.num_fragments() && ct.fragment(e).box == ct.fragment(f).box) ++e;
      if (scalar || !ct.fragment(f).box.Empty()) {
        DstGroup g;
        g.dst_tensor = static_cast<int32_t>(t);
        g.frag_begin = static_cast<int32_t>(f);
        g.frag_count = static_cast<int32_t>(e - f);
        w->dst_groups.push_back(g);
      }
      f = e;
    }
  }
}

namespace {

class CellBuilder {
 public:
  explicit CellBuilder(Work* w) : w_(w) {}

  absl::Status Run(int32_t begin, int32_t end) {
    for (int32_t gi = begin; gi < end; ++gi) {
      const DstGroup& g = w_->dst_groups[gi];
      const CompiledTensor& dt = w_->dst->tensors[g.dst_tensor];
      const CompiledFragment& df = dt.fragment(g.frag_begin);
      Region dbox;
      dbox.rank = df.box.rank();
      for (int d = 0; d < dbox.rank; ++d) {
        dbox.off[d] = df.box.offset[d];
        dbox.len[d] = df.box.length[d];
      }
      int64_t covered = 0;
      for (int32_t mid : w_->maps_of_dst[g.dst_tensor]) {
        const MapEntry& m = w_->maps[mid];
        Region rd;
        if (!IntersectElemBox(dbox, m.dst_offset.data(), m.dst_length.data(), &rd)) continue;
        Region rs = DstToSrc(m, rd);
        if (absl::Status st = AddCells(gi, mid, rs, &covered); !st.ok()) {
          return st;
        }
      }
      if (covered != dbox.Elems()) return Uncovered(g, dbox);
      if (dt.quantized()) {
        if (absl::Status st = EmitQuantCells(w_, gi, &quant_); !st.ok()) {
          return st;
        }
        quant_.clear();
      }
    }
    return absl::OkStatus();
  }

 private:
  static Region DstToSrc(const MapEntry& m, const Region& rd) {
    Region rs;
    rs.rank = m.src_rank;
    const int n = std::min(m.src_rank, m.dst_rank);
    const int ls = m.src_rank - n, ld = m.dst_rank - n;
    for (int k = 0; k < ls; ++k) {
      rs.off[k] = m.src_offset[k];
      rs.len[k] = 1;
    }
    for (int k = 0; k < n; ++k) {
      rs.off[ls + k] = rd.off[ld + k] - m.dst_offset[ld + k] + m.src_offset[ls + k];
      rs.len[ls + k] = rd.len[ld + k];
    }
    return rs;
  }

  // Holder groups of `tensor` whose box meets `rs`, with the intersections.
  void Query(int32_t tensor, const Region& rs) {
    hits_.clear();
    hit_groups_.clear();
    const SourceIndex& si = SourceIndexOf(w_, tensor);
    size_t lo = 0, hi = si.groups.size();
    if (rs.rank > 0) {
      const int k = si.key_dim;
      lo = std::upper_bound(si.max_end.begin(), si.max_end.end(), rs.off[k]) - si.max_end.begin();
      hi = std::lower_bound(si.begin.begin(), si.begin.end(), rs.off[k] + rs.len[k]) -
           si.begin.begin();
    }
    for (size_t i = lo; i < hi; ++i) {
      const HolderGroup& hg = w_->holder_groups[si.groups[i]];
      Region x;
      if (!IntersectElemBox(rs, w_->boxes.offset(hg.box), w_->boxes.length(hg.box), &x)) continue;
      hits_.push_back(x);
      hit_groups_.push_back(si.groups[i]);
    }
  }

  bool Disjoint(int key_dim) const {
    if (hits_.size() < 2) return true;
    // hits_ are ordered by their group's begin along key_dim; intersections
    // keep that order except for clamping at rs, so sweep on the clipped
    // begin with an explicit sort.
    std::vector<int32_t> order(hits_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    const int k = hits_[0].rank > 0 ? key_dim : 0;
    if (hits_[0].rank == 0) return false;  // scalars: two holders of one element
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return hits_[a].off[k] != hits_[b].off[k] ? hits_[a].off[k] < hits_[b].off[k] : a < b;
    });
    std::vector<int32_t> active, keep;
    for (int32_t i : order) {
      keep.clear();
      for (int32_t a : active) {
        if (hits_[a].off[k] + hits_[a].len[k] <= hits_[i].off[k]) continue;
        if (Overlap(hits_[a], hits_[i])) return false;
        keep.push_back(a);
      }
      keep.push_back(i);
      active.swap(keep);
    }
    return true;
  }

  // Grid decomposition of rs by every hit's bounds: each grid cell is held by
  // exactly the hits containing it. Calls fn(cell, holder list) per cell.
  template <typename Fn>
  void Grid(const Region& rs, Fn fn) {
    std::vector<std::vector<int64_t>> cuts(rs.rank);
    for (int d = 0; d < rs.rank; ++d) {
      cuts[d] = {rs.off[d], rs.off[d] + rs.len[d]};
      for (const Region& h : hits_) {
        cuts[d].push_back(h.off[d]);
        cuts[d].push_back(h.off[d] + h.len[d]);
      }
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    std::vector<size_t> idx(rs.rank, 0);
    std::vector<int32_t> holders;
    while (true) {
      Region c;
      c.rank = rs.rank;
      for (int d = 0; d < rs.rank; ++d) {
        c.off[d] = cuts[d][idx[d]];
        c.len[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
      }
      holders.clear();
      for (size_t h = 0; h < hits_.size(); ++h) {
        bool in = true;
        for (int d = 0; d < rs.rank; ++d) {
          if (c.off[d] < hits_[h].off[d] ||
              c.off[d] + c.len[d] > hits_[h].off[d] + hits_[h].len[d]) {
            in = false;
          }
        }
        if (in) holders.push_back(hit_groups_[h]);
      }
      if (!fn(c, holders)) return;
      int d = rs.rank - 1;
      while (d >= 0 && ++idx[d] + 1 >= cuts[d].size()) idx[d--] = 0;
      if (d < 0) return;
    }
  }

  int64_t CellLimitElems(int32_t map, const std::vector<int32_t>& holders) const {
    const MapEntry& m = w_->maps[map];
    const int64_t es = std::max(DTypeSize(w_->src->tensors[m.src_tensor].dtype),
                                DTypeSize(w_->dst->tensors[m.dst_tensor].dtype));
    int64_t limit = w_->opt.pack_bytes;
    bool full = false;
    int32_t members = 1;
    for (int32_t g : holders) {
      const HolderGroup& hg = w_->holder_groups[g];
      if (hg.full_count > 0) full = true;
      for (int32_t p = 0; p < hg.part_count; ++p) {
        members =
            std::max(members, w_->partial_groups[w_->holder_parts[hg.part_begin + p]].frag_count);
      }
    }
    // All contributions of one reduce land on one receiver in one round: keep
    // their sum within the staging cap.
    if (!full) limit = std::min(limit, w_->opt.staging_cap / (members + 1));
    return std::max<int64_t>(1, limit / es);
  }

  void Emit(int32_t group, int32_t map, const Region& c, const std::vector<int32_t>& holders) {
    const MapEntry& me = w_->maps[map];
    if (w_->dst->tensors[me.dst_tensor].quantized()) {
      // Split by the block grid once the whole group is known.
      QuantCandidate q;
      q.map = map;
      q.rank = me.dst_rank;
      SrcToDst(me, c.off, c.len, q.off, q.len);
      q.holders = holders;
      quant_.push_back(std::move(q));
      return;
    }
    split_.clear();
    SplitElemBox(c, CellLimitElems(map, holders), &split_);
    const int32_t hb = static_cast<int32_t>(w_->cell_holders.size());
    w_->cell_holders.insert(w_->cell_holders.end(), holders.begin(), holders.end());
    for (const Region& s : split_) {
      Cell cell;
      cell.map = map;
      cell.dst_group = group;
      cell.box = w_->boxes.Add(s.rank, s.off, s.len);
      cell.hg_begin = hb;
      cell.hg_count = static_cast<int32_t>(holders.size());
      cell.elems = s.Elems();
      w_->cells.push_back(cell);
    }
  }

  absl::Status AddCells(int32_t group, int32_t map, const Region& rs, int64_t* covered) {
    const MapEntry& m = w_->maps[map];
    Query(m.src_tensor, rs);
    if (Disjoint(SourceIndexOf(w_, m.src_tensor).key_dim)) {
      for (size_t h = 0; h < hits_.size(); ++h) {
        one_[0] = hit_groups_[h];
        Emit(group, map, hits_[h], one_);
        *covered += hits_[h].Elems();
      }
      return absl::OkStatus();
    }
    Grid(rs, [&](const Region& c, const std::vector<int32_t>& holders) {
      if (!holders.empty()) {
        Emit(group, map, c, holders);
        *covered += c.Elems();
      }
      return true;
    });
    return absl::OkStatus();
  }

  // Error path: name the first uncovered destination box.
  absl::Status Uncovered(const DstGroup& g, const Region& dbox) {
    const CompiledTensor& dt = w_->dst->tensors[g.dst_tensor];
    const CompiledFragment& df = dt.fragment(g.frag_begin);
    const std::string who =
        absl::StrCat("destination tensor '", dt.name, "' (rank ", df.rank, ", worker ",
                     w_->dst->workers[df.rank], ", fragment ", ToBox(dbox).ToString(), ")");
    // Regions not covered by any mapping entry.
    int64_t mapped = 0;
    for (int32_t mid : w_->maps_of_dst[g.dst_tensor]) {
      Region rd;
      if (IntersectElemBox(dbox, w_->maps[mid].dst_offset.data(), w_->maps[mid].dst_length.data(),
                           &rd)) {
        mapped += rd.Elems();
      }
    }
    if (mapped != dbox.Elems()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": ", dbox.Elems() - mapped, " elements are fed by no mapping entry"));
    }
    for (int32_t mid : w_->maps_of_dst[g.dst_tensor]) {
      const MapEntry& m = w_->maps[mid];
      Region rd;
      if (!IntersectElemBox(dbox, m.dst_offset.data(), m.dst_length.data(), &rd)) continue;
      Region rs = DstToSrc(m, rd);
      Query(m.src_tensor, rs);
      std::optional<Region> hole;
      Grid(rs, [&](const Region& c, const std::vector<int32_t>& holders) {
        if (holders.empty()) {
          hole = c;
          return false;
        }
        return true;
      });
      if (hole) {
        int64_t doff[kMaxDims], dlen[kMaxDims];
        SrcToDst(m, hole->off, hole->len, doff, dlen);
        Region hd;
        hd.rank = m.dst_rank;
        std::copy(doff, doff + m.dst_rank, hd.off);
        std::copy(dlen, dlen + m.dst_rank, hd.len);
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": elements ", ToBox(hd).ToString(), " are held by no source (source tensor '",
            w_->src->tensors[m.src_tensor].name, "' region ", ToBox(*hole).ToString(),
            " has no holder)"));
      }
    }
    return absl::InternalError(absl::StrCat(who, ": coverage count mismatch"));
  }

  Work* w_;
  std::vector<Region> hits_;
  std::vector<int32_t> hit_groups_;
  std::vector<Region> split_;
  std::vector<int32_t> one_ = {0};
  std::vector<QuantCandidate> quant_;
};

}  // namespace

absl::Status BuildGroupCells(Work* w, int32_t group_begin, int32_t group_end) {
  return CellBuilder(w).Run(group_begin, group_end);
}

void SplitElemBox(const ElemBox& b, int64_t max_elems, std::vector<ElemBox>* out) {
  if (b.Elems() <= max_elems) {
    out->push_back(b);
    return;
  }
  int d = 0;
  while (d < b.rank && b.len[d] == 1) ++d;
  int64_t inner = 1;
  for (int k = d + 1; k < b.rank; ++k) inner *= b.len[k];
  const int64_t step = std::max<int64_t>(1, max_elems / inner);
  for (int64_t o = 0; o < b.len[d]; o += step) {
    ElemBox s = b;
    s.off[d] = b.off[d] + o;
    s.len[d] = std::min(step, b.len[d] - o);
    if (step == 1 && inner > max_elems) {
      SplitElemBox(s, max_elems, out);
    } else {
      out->push_back(s);
    }
  }
}

}  // namespace wsync::plan::planner_detail
