#include "catalog/vllm_fp8.h"

#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/block_fp8.h"
#include "common/dtype.h"

namespace wsync::catalog {
namespace {

constexpr int64_t kBlock = kDefaultQuantBlock;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The scale fragment of weight fragment `f` of `t`, or false when `f` does
// not hold whole blocks in the tensor or in its local buffer.
bool ScaleFragment(const v1::TensorLayout& t, int64_t elem_size, const v1::Fragment& f,
                   v1::Fragment* out) {
  const int r = t.shape_size();
  if (r < 2 || f.box().offset_size() != r || f.partial_group() != 0) return false;
  std::vector<int64_t> len(f.box().length().begin(), f.box().length().end());
  std::vector<int64_t> strides(f.strides().begin(), f.strides().end());
  if (strides.empty()) {  // row-major over the box
    strides.assign(r, 1);
    for (int d = r - 2; d >= 0; --d) strides[d] = strides[d + 1] * len[d + 1];
  }
  if (strides[r - 1] != 1 || f.byte_offset() % elem_size != 0) return false;
  // Leading dims (stacked experts) index whole [rows, width] matrices of the
  // local buffer; the last two dims are rows of `width` elements.
  const int64_t width = strides[r - 2];
  if (width < len[r - 1]) return false;
  int64_t e = f.byte_offset() / elem_size;
  std::vector<int64_t> lead(r, 0);
  for (int d = 0; d + 2 < r; ++d) {
    if (strides[d] % width != 0) return false;
    lead[d] = e / strides[d];
    e %= strides[d];
  }
  const int64_t row = e / width, col = e % width;
  if (row % kBlock != 0 || col % kBlock != 0) return false;
  for (int k = 0; k < 2; ++k) {
    const int d = r - 2 + k;
    const int64_t end = f.box().offset(d) + len[d];
    if (f.box().offset(d) % kBlock != 0 || (end % kBlock != 0 && end != t.shape(d))) return false;
  }
  const int64_t sw = CeilDiv(width, kBlock);  // scales per block row of the buffer
  std::vector<int64_t> ss(r);
  ss[r - 1] = 1;
  ss[r - 2] = sw;
  for (int d = r - 3; d >= 0; --d) {
    ss[d] = d == r - 3 ? CeilDiv(strides[d] / width, kBlock) * sw
                       : strides[d] / strides[d + 1] * ss[d + 1];
  }
  int64_t scale_elem = (row / kBlock) * sw + col / kBlock;
  for (int d = 0; d + 2 < r; ++d) scale_elem += lead[d] * ss[d];
  out->set_rank(f.rank());
  for (int d = 0; d < r; ++d) {
    const bool blocked = d >= r - 2;
    const int64_t o = f.box().offset(d);
    out->mutable_box()->add_offset(blocked ? o / kBlock : o);
    out->mutable_box()->add_length(blocked ? CeilDiv(o + len[d], kBlock) - o / kBlock : len[d]);
    out->add_strides(ss[d]);
  }
  out->set_buffer(absl::StrCat(f.buffer().empty() ? t.name() : f.buffer(), "_scale_inv"));
  out->set_byte_offset(4 * scale_elem);
  return true;
}

}  // namespace

bool IsBlockFp8Linear(const std::string& name) {
  if (absl::StrContains(name, "_scale_inv")) return false;
  return absl::EndsWith(name, "_proj.weight") || absl::StrContains(name, "experts.w13_weight") ||
         absl::StrContains(name, "experts.w2_weight");
}

std::string ScaleTensorName(const std::string& weight_name) {
  const size_t at = weight_name.rfind("weight");
  if (at == std::string::npos) return weight_name + "_scale_inv";
  std::string s = weight_name;
  s.insert(at + 6, "_scale_inv");
  return s;
}

absl::Status QuantizeLinearWeightsBlockFp8(BuiltGroup* group, int* kept) {
  auto buffers_of = [](const v1::TensorLayout& t) {
    std::set<std::string> b;
    if (t.has_mesh()) b.insert(t.mesh().buffer().empty() ? t.name() : t.mesh().buffer());
    for (const v1::Fragment& f : t.fragments().fragments()) {
      b.insert(f.buffer().empty() ? t.name() : f.buffer());
    }
    return b;
  };
  // Candidates with their scale tensors.
  const size_t n = group->tensors.size();
  std::vector<bool> quant(n, false);
  std::vector<v1::TensorLayout> scales(n);
  for (size_t i = 0; i < n; ++i) {
    const v1::TensorLayout& t = group->tensors[i];
    if (!IsBlockFp8Linear(t.name()) || !t.has_fragments() || !IsFloatingPoint(t.dtype()) ||
        t.shape_size() < 2) {
      continue;
    }
    const int64_t es = DTypeSize(t.dtype());
    v1::TensorLayout& s = scales[i];
    s.set_name(ScaleTensorName(t.name()));
    s.set_dtype(v1::FP32);
    for (int d = 0; d < t.shape_size(); ++d) {
      s.add_shape(d >= t.shape_size() - 2 ? CeilDiv(t.shape(d), kBlock) : t.shape(d));
    }
    quant[i] = true;
    for (const v1::Fragment& f : t.fragments().fragments()) {
      if (!ScaleFragment(t, es, f, s.mutable_fragments()->add_fragments())) {
        quant[i] = false;
        break;
      }
    }
  }
  // Tensors sharing a buffer (per-expert slices of w13 / w2) change dtype
  // together or not at all: their byte offsets depend on it.
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> fixed;  // buffers holding a tensor that keeps its dtype
    for (size_t i = 0; i < n; ++i) {
      if (!quant[i]) {
        for (const std::string& b : buffers_of(group->tensors[i])) fixed.insert(b);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (!quant[i]) continue;
      for (const std::string& b : buffers_of(group->tensors[i])) {
        if (fixed.count(b)) {
          quant[i] = false;
          changed = true;
          break;
        }
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    v1::TensorLayout& t = group->tensors[i];
    if (!quant[i]) {
      if (kept != nullptr && IsBlockFp8Linear(t.name())) ++*kept;
      continue;
    }
    // Same elements, one byte each: byte offsets shrink by the old size.
    const int64_t es = DTypeSize(t.dtype());
    for (v1::Fragment& f : *t.mutable_fragments()->mutable_fragments()) {
      f.set_byte_offset(f.byte_offset() / es);
    }
    t.set_dtype(v1::FP8_E4M3);
    t.mutable_block_quantization()->set_scale_tensor(scales[i].name());
  }
  for (size_t i = 0; i < n; ++i) {
    if (quant[i]) group->tensors.push_back(std::move(scales[i]));
  }
  return absl::OkStatus();
}

}  // namespace wsync::catalog
