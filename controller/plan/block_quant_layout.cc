// CompileSide's block fp8 quantization checks (see layout_internal.h). The
// planner relies on them: a quantized fragment covers whole blocks (edge
// blocks included), so a receiver always quantizes blocks it holds entirely,
// and its scales have exactly one home on the same rank.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "controller/plan/layout_internal.h"

namespace wsync::plan::internal {
namespace {

// The fragment's blocks in the scale tensor's coordinates.
BoxNd BlockBox(const CompiledTensor& t, const BoxNd& box) {
  BoxNd b = box;
  const int r = box.rank();
  for (int k = 0; k < 2; ++k) {
    const int d = r - 2 + k;
    const int64_t bs = t.quant_block[k];
    const int64_t lo = box.offset[d] / bs;
    const int64_t hi = (box.offset[d] + box.length[d] + bs - 1) / bs;
    b.offset[d] = lo;
    b.length[d] = hi - lo;
  }
  return b;
}

bool Contains(const BoxNd& outer, const BoxNd& inner) {
  for (int d = 0; d < inner.rank(); ++d) {
    if (inner.offset[d] < outer.offset[d] ||
        inner.offset[d] + inner.length[d] > outer.offset[d] + outer.length[d]) {
      return false;
    }
  }
  return true;
}

// Quantized tensor w: FP8_E4M3, rank >= 2, a 2-entry positive block (none:
// 128x128), which it takes.
absl::Status ResolveBlock(const std::string& where, const v1::BlockQuantization& q,
                          CompiledTensor& w) {
  if (w.dtype != v1::FP8_E4M3) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": block_quantization needs dtype ",
                                                   "FP8_E4M3, the tensor is ", DTypeName(w.dtype)));
  }
  if (w.shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": block_quantization needs at least 2 dims (blocks cut the last two), shape ",
        DimsString(w.shape)));
  }
  if (q.block_size() != 0 && q.block_size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": block_quantization.block has ", q.block_size(),
                     " entries, want 2 (rows, cols) or none for 128x128"));
  }
  for (int k = 0; k < 2; ++k) {
    w.quant_block[k] = q.block_size() == 0 ? 128 : q.block(k);
    if (w.quant_block[k] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": block_quantization.block must be positive"));
    }
  }
  return absl::OkStatus();
}

// The scale tensor of quantized tensor wi (q.scale_tensor): another tensor
// of the side, not quantized nor anyone's scales, FP32 of the block-grid
// shape. Links the two.
absl::Status LinkScaleTensor(const std::string& where, const v1::BlockQuantization& q, int32_t wi,
                             CompiledSide* out) {
  auto si = out->tensor_index.find(q.scale_tensor());
  if (q.scale_tensor().empty() || si == out->tensor_index.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": scale tensor '", q.scale_tensor(),
                                                   "' is not a tensor of this side"));
  }
  CompiledTensor& w = out->tensors[wi];
  CompiledTensor& s = out->tensors[si->second];
  if (si->second == wi || s.scales_for >= 0 || s.scale_tensor >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": scale tensor '", s.name,
                     "' is the tensor itself, another tensor's scale tensor, or quantized itself"));
  }
  std::vector<int64_t> want = w.shape;
  for (int k = 0; k < 2; ++k) {
    int64_t& d = want[want.size() - 2 + k];
    d = (d + w.quant_block[k] - 1) / w.quant_block[k];
  }
  if (s.dtype != v1::FP32 || s.shape != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": scale tensor '", s.name, "' must be FP32 of shape ",
                     DimsString(want), " (one scale per ", w.quant_block[0], "x", w.quant_block[1],
                     " block), it is ", DTypeName(s.dtype), " ", DimsString(s.shape)));
  }
  w.scale_tensor = si->second;
  s.scales_for = wi;
  return absl::OkStatus();
}

// Fragment f of quantized tensor w holds whole blocks (edge blocks included).
absl::Status CheckWholeBlocks(const std::string& where, const CompiledTensor& w,
                              const CompiledFragment& f) {
  const int r = f.box.rank();
  for (int k = 0; k < 2; ++k) {
    const int d = r - 2 + k;
    const int64_t bs = w.quant_block[k];
    const int64_t end = f.box.offset[d] + f.box.length[d];
    if (f.box.offset[d] % bs != 0 || (end % bs != 0 && end != w.shape[d])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " rank ", f.rank, " box ", f.box.ToString(), ": dim ", d,
                       " is not aligned to the quantization block (", bs,
                       "); every destination fragment of a block-quantized tensor must hold whole "
                       "blocks (edge blocks included), as vLLM requires of its shards"));
    }
  }
  return absl::OkStatus();
}

// Every fragment of w holds whole blocks, inside one fragment of its scale
// tensor s on its rank (w.scale_fragment), and every rank's scale fragments
// hold exactly the blocks of its fragments.
absl::Status MatchScaleFragments(const std::string& side_name, const std::string& where,
                                 CompiledTensor& w, const CompiledTensor& s) {
  std::map<int32_t, std::vector<int32_t>> scale_frags;  // rank -> fragments
  std::map<int32_t, int64_t> scale_elems, block_elems;
  for (size_t i = 0; i < s.num_fragments(); ++i) {
    if (s.fragment(i).box.Empty()) continue;
    scale_frags[s.fragment(i).rank].push_back(static_cast<int32_t>(i));
    scale_elems[s.fragment(i).rank] += s.fragment(i).box.NumElements();
  }
  w.scale_fragment.assign(w.num_fragments(), -1);
  for (size_t i = 0; i < w.num_fragments(); ++i) {
    const CompiledFragment& f = w.fragment(i);
    if (f.box.Empty()) continue;
    if (absl::Status st = CheckWholeBlocks(where, w, f); !st.ok()) return st;
    const BoxNd bb = BlockBox(w, f.box);
    block_elems[f.rank] += bb.NumElements();
    for (int32_t j : scale_frags[f.rank]) {
      if (Contains(s.fragment(j).box, bb)) {
        w.scale_fragment[i] = j;
        break;
      }
    }
    if (w.scale_fragment[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " rank ", f.rank, " box ", f.box.ToString(), ": no fragment of scale tensor '",
          s.name, "' on that rank holds its blocks ", bb.ToString()));
    }
  }
  for (const auto& [rank, n] : scale_elems) {
    if (block_elems[rank] != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(side_name, s.name), " rank ", rank, ": holds ", n, " scales, but the rank holds ",
          block_elems[rank], " blocks of '", w.name,
          "' (a scale fragment must hold exactly the blocks of its rank's fragments)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveBlockQuantization(const v1::Side& side, SideRole role, CompiledSide* out) {
  for (const v1::TensorLayout& t : side.tensors()) {
    if (!t.has_block_quantization()) continue;
    const std::string where = Where(side.name(), t.name());
    if (role != SideRole::kDestination) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": block_quantization is a destination declaration"));
    }
    const v1::BlockQuantization& q = t.block_quantization();
    const int32_t wi = out->tensor_index.at(t.name());
    CompiledTensor& w = out->tensors[wi];
    if (absl::Status s = ResolveBlock(where, q, w); !s.ok()) return s;
    if (absl::Status s = LinkScaleTensor(where, q, wi, out); !s.ok()) return s;
    if (absl::Status s = MatchScaleFragments(side.name(), where, w, out->tensors[w.scale_tensor]);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan::internal
