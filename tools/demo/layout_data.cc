#include "tools/demo/layout_data.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/block_fp8.h"
#include "common/cast.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace wsync::demo {

namespace {

uint64_t Fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Writes `v` as one element of `dtype` at `p`.
void Encode(v1::DType dtype, double v, uint8_t* p) {
  switch (dtype) {
    case v1::FP32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case v1::BF16: {
      const uint16_t h = FloatToBf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case v1::FP16: {
      const uint16_t h = FloatToFp16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case v1::FP8_E4M3:
      *p = FloatToFp8E4M3(static_cast<float>(v));
      return;
    case v1::FP8_E5M2:
      *p = FloatToFp8E5M2(static_cast<float>(v));
      return;
    case v1::INT8:
    case v1::UINT8:
    case v1::BOOL:
      *p = static_cast<uint8_t>(static_cast<int8_t>(v));
      return;
    case v1::INT32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(p, &i, 4);
      return;
    }
    case v1::INT64: {
      const int64_t i = static_cast<int64_t>(v);
      std::memcpy(p, &i, 8);
      return;
    }
    default:
      return;
  }
}

// Calls fn(global index, byte offset in buffer) for every element of `f`.
template <typename Fn>
void ForEachElement(const plan::CompiledFragment& f, int64_t elem_size, Fn fn) {
  const int n = f.box.rank();
  for (int64_t len : f.box.length) {
    if (len <= 0) return;
  }
  std::vector<int64_t> i(n, 0);
  std::vector<int64_t> g(f.box.offset.begin(), f.box.offset.end());
  while (true) {
    int64_t off = 0;
    for (int d = 0; d < n; ++d) off += i[d] * f.strides[d];
    fn(g, f.byte_offset + elem_size * off);
    int d = n - 1;
    for (; d >= 0; --d) {
      if (++i[d] < f.box.length[d]) {
        ++g[d];
        break;
      }
      i[d] = 0;
      g[d] = f.box.offset[d];
    }
    if (d < 0) return;
  }
}

int64_t Linear(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t l = 0;
  for (size_t d = 0; d < shape.size(); ++d) l = l * shape[d] + idx[d];
  return l;
}

}  // namespace

double SourceValue(const std::string& tensor, int64_t linear, int64_t version) {
  const uint64_t h = Fnv(tensor) % 97;
  return static_cast<double>(
             (h + static_cast<uint64_t>(linear) * 7 + static_cast<uint64_t>(version) * 13) % 199) -
         99.0;
}

std::vector<std::vector<BufferSpec>> BuffersPerRank(const plan::CompiledSide& side) {
  std::vector<std::map<std::string, BufferSpec>> per(side.workers.size());
  for (const plan::CompiledTensor& t : side.tensors) {
    const int64_t es = DTypeSize(t.dtype);
    for (const plan::CompiledFragment& f : t.fragments()) {
      int64_t last = 0;
      bool empty = false;
      for (int d = 0; d < f.box.rank(); ++d) {
        if (f.box.length[d] <= 0) empty = true;
        last += (f.box.length[d] - 1) * f.strides[d];
      }
      const std::string& name = side.buffer_names[t.buffer(f)];
      BufferSpec& b = per[f.rank][name];
      b.name = name;
      b.dtype = t.dtype;
      if (!empty) b.bytes = std::max(b.bytes, f.byte_offset + es * (last + 1));
    }
  }
  std::vector<std::vector<BufferSpec>> out(per.size());
  for (size_t r = 0; r < per.size(); ++r) {
    for (auto& [name, b] : per[r]) out[r].push_back(b);
  }
  return out;
}

absl::Status FillSource(const plan::CompiledSide& side, int32_t rank, int64_t version,
                        const BufferMap& buffers) {
  for (const plan::CompiledTensor& t : side.tensors) {
    const int64_t es = DTypeSize(t.dtype);
    for (const plan::CompiledFragment& f : t.fragments()) {
      if (f.rank != rank) continue;
      if (f.partial_group != 0) {
        return absl::UnimplementedError(
            absl::StrCat("tensor '", t.name, "': partial fragments are not filled by the demo"));
      }
      auto it = buffers.find(side.buffer_names[t.buffer(f)]);
      if (it == buffers.end()) {
        return absl::NotFoundError(absl::StrCat(
            "no memory for buffer '", side.buffer_names[t.buffer(f)], "' of rank ", rank));
      }
      uint8_t* base = it->second;
      ForEachElement(f, es, [&](const std::vector<int64_t>& g, int64_t off) {
        Encode(t.dtype, SourceValue(t.name, Linear(g, t.shape), version), base + off);
      });
    }
  }
  return absl::OkStatus();
}

namespace {

// Source tensor and index feeding destination element g of `t` (nullptr: none).
const plan::CompiledTensor* SourceOf(const plan::CompiledTensor& t,
                                     const std::vector<const v1::TensorMapping*>* maps,
                                     const plan::CompiledSide& source,
                                     const std::vector<int64_t>& g, std::string* src_name,
                                     std::vector<int64_t>* src_idx) {
  *src_name = t.name;
  *src_idx = g;
  if (maps == nullptr) return source.Find(t.name);
  for (const v1::TensorMapping* m : *maps) {
    bool inside = true;
    for (size_t d = 0; d < g.size() && inside; ++d) {
      const int64_t rel = g[d] - m->dst_offset(static_cast<int>(d));
      inside = rel >= 0 && rel < m->src_box().length(static_cast<int>(d));
      if (inside) (*src_idx)[d] = m->src_box().offset(static_cast<int>(d)) + rel;
    }
    if (inside) {
      *src_name = m->src();
      return source.Find(m->src());
    }
  }
  return nullptr;
}

// The block grid of fragment f of block-fp8 tensor t (whole blocks).
BlockGrid FragmentGrid(const plan::CompiledTensor& t, const plan::CompiledFragment& f) {
  const int nd = f.box.rank();
  BlockGrid grid;
  for (int d = 0; d + 2 < nd; ++d) grid.outer *= f.box.length[d];
  grid.rows = f.box.length[nd - 2];
  grid.cols = f.box.length[nd - 1];
  grid.block_rows = t.quant_block[0];
  grid.block_cols = t.quant_block[1];
  return grid;
}

// The source values of fragment f's elements as the trainer holds them
// (row-major), their byte offsets, and whether any element is unmapped.
struct FragmentValues {
  std::vector<float> x;
  std::vector<int64_t> offs;
  bool unmapped = false;
};

FragmentValues SourceValuesOf(const plan::CompiledTensor& t, const plan::CompiledFragment& f,
                              const std::vector<const v1::TensorMapping*>* maps,
                              const plan::CompiledSide& source, int64_t version) {
  FragmentValues v;
  std::string src_name;
  std::vector<int64_t> src_idx;
  ForEachElement(f, 1, [&](const std::vector<int64_t>& g, int64_t off) {
    const plan::CompiledTensor* st = SourceOf(t, maps, source, g, &src_name, &src_idx);
    uint8_t held[8] = {};
    if (st == nullptr) {
      v.unmapped = true;
    } else {
      Encode(st->dtype, SourceValue(src_name, Linear(src_idx, st->shape), version), held);
    }
    v.x.push_back(st == nullptr ? 0.0f : static_cast<float>(ReadElement(st->dtype, held)));
    v.offs.push_back(off);
  });
  return v;
}

// The scales of fragment f (blocks row-major over its grid) in scale
// fragment sf against `scales`.
void CheckFragmentScales(const plan::CompiledTensor& t, const plan::CompiledFragment& f,
                         const plan::CompiledTensor& sc, const plan::CompiledFragment& sf,
                         const uint8_t* sbuf, const BlockGrid& grid,
                         const std::vector<float>& scales, int32_t rank, VerifyResult* r) {
  const int nd = f.box.rank();
  std::vector<int64_t> b(nd, 0);
  const int64_t rb = grid.row_blocks(), cb = grid.col_blocks();
  for (int64_t k = 0; k < grid.num_blocks(); ++k) {
    int64_t rem = k;
    b[nd - 1] = rem % cb;
    rem /= cb;
    b[nd - 2] = rem % rb;
    rem /= rb;
    for (int d = nd - 3; d >= 0; --d) {
      b[d] = rem % f.box.length[d];
      rem /= f.box.length[d];
    }
    int64_t e = 0;
    for (int d = 0; d < nd; ++d) {
      const int64_t global = d >= nd - 2 ? f.box.offset[d] / t.quant_block[d - (nd - 2)] + b[d]
                                         : f.box.offset[d] + b[d];
      e += (global - sf.box.offset[d]) * sf.strides[d];
    }
    float got;
    std::memcpy(&got, sbuf + sf.byte_offset + 4 * e, 4);
    ++r->elements;
    r->bytes += 4;
    if (!(got == scales[k]) && ++r->wrong_elements == 1) {
      r->first_error =
          absl::StrCat("scale tensor '", sc.name, "' rank ", rank, " block ", k, " of fragment ",
                       f.box.ToString(), ": expected ", scales[k], ", found ", got);
    }
  }
}

// A block-fp8 tensor: each fragment (whole blocks) of `rank` against the
// reference quantizer (common/block_fp8.h) applied to its source values,
// fp8 bytes and the scale tensor's values.
absl::Status VerifyQuantized(const plan::CompiledTensor& t,
                             const std::vector<const v1::TensorMapping*>* maps,
                             const plan::CompiledSide& destination,
                             const plan::CompiledSide& source, int32_t rank, int64_t version,
                             const BufferMap& buffers, VerifyResult* r) {
  const plan::CompiledTensor& sc = destination.tensors[t.scale_tensor];
  for (size_t fi = 0; fi < t.num_fragments(); ++fi) {
    const plan::CompiledFragment& f = t.fragment(fi);
    if (f.rank != rank || f.box.Empty()) continue;
    const plan::CompiledFragment& sf = sc.fragment(t.scale_fragment[fi]);
    auto wit = buffers.find(destination.buffer_names[t.buffer(f)]);
    auto sit = buffers.find(destination.buffer_names[sc.buffer(sf)]);
    if (wit == buffers.end() || sit == buffers.end()) {
      return absl::NotFoundError(absl::StrCat("no memory for the buffers of '", t.name, "'"));
    }
    const BlockGrid grid = FragmentGrid(t, f);
    const FragmentValues v = SourceValuesOf(t, f, maps, source, version);
    std::vector<uint8_t> want(v.x.size());
    std::vector<float> scales(grid.num_blocks());
    RETURN_IF_ERROR(QuantizeBlocksFp8E4M3(v.x.data(), grid, want.data(), scales.data()));
    for (size_t k = 0; k < v.x.size(); ++k) {
      ++r->elements;
      ++r->bytes;
      const uint8_t got = wit->second[v.offs[k]];
      if ((v.unmapped || got != want[k]) && ++r->wrong_elements == 1) {
        r->first_error = absl::StrCat("block-fp8 tensor '", t.name, "' rank ", rank, " element ", k,
                                      " of fragment ", f.box.ToString(), ": expected fp8 ", want[k],
                                      ", found ", got, v.unmapped ? " (unmapped)" : "");
      }
    }
    CheckFragmentScales(t, f, sc, sf, sit->second, grid, scales, rank, r);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VerifyResult> VerifyDestination(const v1::TransferSpec& spec,
                                               const plan::CompiledSide& destination,
                                               const plan::CompiledSide& source, int32_t rank,
                                               int64_t version, const BufferMap& buffers) {
  std::map<std::string, std::vector<const v1::TensorMapping*>> maps;
  for (const v1::TensorMapping& m : spec.mappings()) maps[m.dst()].push_back(&m);
  VerifyResult r;
  for (const plan::CompiledTensor& t : destination.tensors) {
    const int64_t es = DTypeSize(t.dtype);
    const auto mit = maps.find(t.name);
    if (t.scales_for >= 0) continue;  // checked with the tensor it scales
    if (t.quantized()) {
      RETURN_IF_ERROR(VerifyQuantized(t, mit == maps.end() ? nullptr : &mit->second, destination,
                                      source, rank, version, buffers, &r));
      continue;
    }
    for (const plan::CompiledFragment& f : t.fragments()) {
      if (f.rank != rank) continue;
      auto it = buffers.find(destination.buffer_names[t.buffer(f)]);
      if (it == buffers.end()) {
        return absl::NotFoundError(
            absl::StrCat("no memory for buffer '", destination.buffer_names[t.buffer(f)], "'"));
      }
      const uint8_t* base = it->second;
      std::vector<int64_t> src_idx;
      ForEachElement(f, es, [&](const std::vector<int64_t>& g, int64_t off) {
        ++r.elements;
        r.bytes += es;
        std::string src_name = t.name;
        src_idx = g;
        bool mapped = mit == maps.end();
        if (!mapped) {
          for (const v1::TensorMapping* m : mit->second) {
            bool inside = true;
            for (size_t d = 0; d < g.size() && inside; ++d) {
              const int64_t rel = g[d] - m->dst_offset(static_cast<int>(d));
              inside = rel >= 0 && rel < m->src_box().length(static_cast<int>(d));
              if (inside) src_idx[d] = m->src_box().offset(static_cast<int>(d)) + rel;
            }
            if (inside) {
              src_name = m->src();
              mapped = true;
              break;
            }
          }
        }
        const plan::CompiledTensor* st = mapped ? source.Find(src_name) : nullptr;
        uint8_t want[8] = {};
        if (st != nullptr) {
          // The source holds the value in its dtype; the sync casts that.
          uint8_t held[8] = {};
          Encode(st->dtype, SourceValue(src_name, Linear(src_idx, st->shape), version), held);
          Encode(t.dtype, ReadElement(st->dtype, held), want);
        }
        if (st == nullptr || std::memcmp(want, base + off, es) != 0) {
          if (++r.wrong_elements == 1) {
            r.first_error = st == nullptr
                                ? absl::StrCat("tensor '", t.name, "' element [",
                                               absl::StrJoin(g, ","), "]: no source maps to it")
                                : absl::StrCat("tensor '", t.name, "' rank ", rank, " element [",
                                               absl::StrJoin(g, ","), "] (from '", src_name, "' [",
                                               absl::StrJoin(src_idx, ","), "]): expected ",
                                               ReadElement(t.dtype, want), ", found ",
                                               ReadElement(t.dtype, base + off));
          }
        }
      });
    }
  }
  return r;
}

void Poison(const std::vector<BufferSpec>& buffers, const BufferMap& memory) {
  for (const BufferSpec& b : buffers) {
    auto it = memory.find(b.name);
    if (it != memory.end()) std::memset(it->second, 0xA5, static_cast<size_t>(b.bytes));
  }
}

}  // namespace wsync::demo
