// Stage 1: spec-level validation and the mapping table. Every destination
// tensor gets its MapEntry list (identity by name when it has none); casts
// must be declared, boxes in range, entries of one tensor disjoint. Coverage
// of destination fragments by sources is checked while building cells.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cast.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

std::string RegionStr(const std::vector<int64_t>& off, const std::vector<int64_t>& len) {
  BoxNd b;
  b.offset.assign(off.begin(), off.end());
  b.length.assign(len.begin(), len.end());
  return b.ToString();
}

absl::Status CheckCast(const Work& w, const CompiledTensor& s, const CompiledTensor& d) {
  if (s.dtype == d.dtype) return absl::OkStatus();
  bool allowed = false;
  for (const v1::Cast& c : w.spec->options().allowed_casts()) {
    if (c.from() == s.dtype && c.to() == d.dtype) allowed = true;
  }
  if (!allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype mismatch: source tensor '", s.name, "' is ", DTypeName(s.dtype),
        ", destination tensor '", d.name, "' is ", DTypeName(d.dtype),
        ", and options.allowed_casts has no ", DTypeName(s.dtype), "->", DTypeName(d.dtype)));
  }
  if (!CanConvert(s.dtype, d.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("cast ", DTypeName(s.dtype), "->",
                                                   DTypeName(d.dtype), " for tensor '", d.name,
                                                   "' is not a supported conversion"));
  }
  return absl::OkStatus();
}

// Destination d may be fed by source s: not a scale tensor (quantization
// writes those), and a quantized d reads bf16, fp16 or fp32.
absl::Status CheckFeeds(const Work& w, const std::string& where, const CompiledTensor& s,
                        const CompiledTensor& d) {
  if (d.scales_for >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": destination tensor '", d.name, "' is the scale tensor of block-quantized '",
        w.dst->tensors[d.scales_for].name, "': quantization writes it, no mapping may feed it"));
  }
  if (d.quantized() && s.dtype != v1::BF16 && s.dtype != v1::FP16 && s.dtype != v1::FP32) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": destination tensor '", d.name, "' is block-fp8 quantized, source tensor '",
        s.name, "' is ", DTypeName(s.dtype), " (block quantization reads bf16, fp16 or fp32)"));
  }
  return absl::OkStatus();
}

// m's source box (src_off, src_len) and destination offset: ranks of the
// two shapes, inside them, extra leading source dims of length 1. Fills m's
// regions (the destination length is the source box's trailing dims).
absl::Status SetRegions(const std::string& where, const CompiledTensor& s, const CompiledTensor& d,
                        const std::vector<int64_t>& src_off, const std::vector<int64_t>& src_len,
                        const std::vector<int64_t>& dst_off, MapEntry* m) {
  if (static_cast<int>(src_off.size()) != m->src_rank ||
      static_cast<int>(src_len.size()) != m->src_rank) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": src_box ", RegionStr(src_off, src_len),
                                                   " does not have the rank of source shape ",
                                                   DimsString(s.shape)));
  }
  if (static_cast<int>(dst_off.size()) != m->dst_rank) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dst_offset ", DimsString(dst_off),
                                                   " does not have the rank of destination shape ",
                                                   DimsString(d.shape)));
  }
  for (int k = 0; k < m->src_rank; ++k) {
    if (src_len[k] < 0 || src_off[k] < 0 || src_off[k] + src_len[k] > s.shape[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": src_box ", RegionStr(src_off, src_len),
                       " out of range of source shape ", DimsString(s.shape)));
    }
  }
  const int n = std::min(m->src_rank, m->dst_rank);
  for (int k = 0; k < m->src_rank - n; ++k) {
    if (src_len[k] != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": src_box ", RegionStr(src_off, src_len),
                       " has more dims than destination shape ", DimsString(d.shape),
                       " and its leading dim ", k, " is not of length 1"));
    }
  }
  m->src_offset = src_off;
  m->src_length = src_len;
  m->dst_offset = dst_off;
  m->dst_length.assign(m->dst_rank, 1);
  for (int k = 0; k < n; ++k) m->dst_length[m->dst_rank - n + k] = src_len[m->src_rank - n + k];
  for (int k = 0; k < m->dst_rank; ++k) {
    if (dst_off[k] < 0 || dst_off[k] + m->dst_length[k] > d.shape[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": destination region ", RegionStr(dst_off, m->dst_length),
                       " out of range of destination shape ", DimsString(d.shape)));
    }
  }
  return absl::OkStatus();
}

// Identity mappings keep the shape; integer/float changes are never cast;
// other casts must be declared (a quantized tensor's block_quantization is
// the declaration of its cast).
absl::Status CheckTypes(const Work& w, int index, const std::string& dst_name,
                        const CompiledTensor& s, const CompiledTensor& d) {
  if (index < 0 && s.shape != d.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape mismatch for identity mapping of tensor '", dst_name, "': source ",
                     DimsString(s.shape), ", destination ", DimsString(d.shape)));
  }
  if (IsFloatingPoint(s.dtype) != IsFloatingPoint(d.dtype) && s.dtype != d.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype mismatch: source tensor '", s.name, "' is ", DTypeName(s.dtype),
                     ", destination tensor '", d.name, "' is ", DTypeName(d.dtype),
                     " (integer/float changes are never cast)"));
  }
  if (d.quantized()) return absl::OkStatus();
  return CheckCast(w, s, d);
}

absl::Status AddEntry(Work* w, int index, const std::string& src_name, const std::string& dst_name,
                      const std::vector<int64_t>& src_off, const std::vector<int64_t>& src_len,
                      const std::vector<int64_t>& dst_off) {
  const std::string where =
      index < 0 ? absl::StrCat("identity mapping of tensor '", dst_name, "'")
                : absl::StrCat("mapping ", index, " (dst '", dst_name, "', src '", src_name, "')");
  auto di = w->dst->tensor_index.find(dst_name);
  if (di == w->dst->tensor_index.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown destination tensor '", dst_name, "'"));
  }
  auto si = w->src->tensor_index.find(src_name);
  if (si == w->src->tensor_index.end()) {
    return absl::InvalidArgumentError(
        index < 0 ? absl::StrCat("destination tensor '", dst_name,
                                 "' has no mapping and no source tensor of that name")
                  : absl::StrCat(where, ": unknown source tensor '", src_name, "'"));
  }
  const CompiledTensor& s = w->src->tensors[si->second];
  const CompiledTensor& d = w->dst->tensors[di->second];
  if (absl::Status st = CheckFeeds(*w, where, s, d); !st.ok()) return st;
  MapEntry m;
  m.src_tensor = si->second;
  m.dst_tensor = di->second;
  m.src_rank = static_cast<int>(s.shape.size());
  m.dst_rank = static_cast<int>(d.shape.size());
  if (m.src_rank > kMaxDims || m.dst_rank > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": more than ", kMaxDims, " dims"));
  }
  if (absl::Status st = SetRegions(where, s, d, src_off, src_len, dst_off, &m); !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckTypes(*w, index, dst_name, s, d); !st.ok()) return st;
  w->maps_of_dst[m.dst_tensor].push_back(static_cast<int32_t>(w->maps.size()));
  w->maps.push_back(std::move(m));
  return absl::OkStatus();
}

// Entries of one destination tensor must not overlap (the value would be
// ambiguous). Sweep along dim 0 so that stacked-expert tables stay linear.
absl::Status CheckDisjoint(const Work& w, int32_t dst_tensor) {
  std::vector<int32_t> ids = w.maps_of_dst[dst_tensor];
  if (ids.size() < 2) return absl::OkStatus();
  const int rank = w.maps[ids[0]].dst_rank;
  if (rank == 0) {
    return absl::InvalidArgumentError(absl::StrCat("destination tensor '",
                                                   w.dst->tensors[dst_tensor].name,
                                                   "' (a scalar) has more than one mapping"));
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return w.maps[a].dst_offset[0] != w.maps[b].dst_offset[0]
               ? w.maps[a].dst_offset[0] < w.maps[b].dst_offset[0]
               : a < b;
  });
  std::vector<int32_t> active;
  for (int32_t id : ids) {
    const MapEntry& m = w.maps[id];
    std::vector<int32_t> keep;
    for (int32_t a : active) {
      const MapEntry& o = w.maps[a];
      if (o.dst_offset[0] + o.dst_length[0] <= m.dst_offset[0]) continue;
      keep.push_back(a);
      bool overlap = true;
      for (int k = 0; k < rank; ++k) {
        const int64_t lo = std::max(m.dst_offset[k], o.dst_offset[k]);
        const int64_t hi =
            std::min(m.dst_offset[k] + m.dst_length[k], o.dst_offset[k] + o.dst_length[k]);
        if (hi <= lo) overlap = false;
      }
      if (overlap) {
        return absl::InvalidArgumentError(absl::StrCat(
            "destination tensor '", w.dst->tensors[dst_tensor].name, "': mapping regions ",
            RegionStr(o.dst_offset, o.dst_length), " (from '", w.src->tensors[o.src_tensor].name,
            "') and ", RegionStr(m.dst_offset, m.dst_length), " (from '",
            w.src->tensors[m.src_tensor].name, "') overlap"));
      }
    }
    keep.push_back(id);
    active.swap(keep);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateAndMap(Work* w) {
  w->maps_of_dst.assign(w->dst->tensors.size(), {});
  const auto& mappings = w->spec->mappings();
  for (int i = 0; i < mappings.size(); ++i) {
    const v1::TensorMapping& m = mappings[i];
    std::vector<int64_t> so(m.src_box().offset().begin(), m.src_box().offset().end());
    std::vector<int64_t> sl(m.src_box().length().begin(), m.src_box().length().end());
    std::vector<int64_t> doff(m.dst_offset().begin(), m.dst_offset().end());
    if (m.src_box().offset_size() != m.src_box().length_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mapping ", i, " (dst '", m.dst(), "'): src_box offset and length differ in rank"));
    }
    if (absl::Status st = AddEntry(w, i, m.src(), m.dst(), so, sl, doff); !st.ok()) return st;
  }
  for (size_t t = 0; t < w->dst->tensors.size(); ++t) {
    if (!w->maps_of_dst[t].empty()) continue;
    const CompiledTensor& d = w->dst->tensors[t];
    if (d.scales_for >= 0) continue;  // written by its tensor's quantization
    auto si = w->src->tensor_index.find(d.name);
    std::vector<int64_t> zero(d.shape.size(), 0);
    const std::vector<int64_t>& shape =
        si == w->src->tensor_index.end() ? d.shape : w->src->tensors[si->second].shape;
    std::vector<int64_t> szero(shape.size(), 0);
    if (absl::Status st = AddEntry(w, -1, d.name, d.name, szero, shape, zero); !st.ok()) return st;
  }
  for (size_t t = 0; t < w->dst->tensors.size(); ++t) {
    if (absl::Status st = CheckDisjoint(*w, static_cast<int32_t>(t)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan::planner_detail
