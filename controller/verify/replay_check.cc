// The replay oracle's test data and its check: synthetic element values
// written into every source fragment, and every destination element (or
// block-fp8 byte and scale) compared with the value its mapping names.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_fp8.h"
#include "common/cast.h"
#include "common/status_macros.h"
#include "controller/verify/replay.h"

namespace wsync::plan {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint64_t NameHash(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status WriteValue(double v, v1::DType dtype, uint8_t* at) {
  if (IsFloatingPoint(dtype)) {
    const float f = static_cast<float>(v);
    return ConvertElements(&f, v1::FP32, at, dtype, 1);
  }
  switch (dtype) {
    case v1::INT8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(at, &x, 1);
      break;
    }
    case v1::UINT8:
    case v1::BOOL: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(at, &x, 1);
      break;
    }
    case v1::INT32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(at, &x, 4);
      break;
    }
    case v1::INT64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(at, &x, 8);
      break;
    }
    default:
      return absl::InvalidArgumentError("unsupported dtype");
  }
  return absl::OkStatus();
}

// Visits every element of fragment f: fn(linear index in the tensor, byte offset).
template <typename Fn>
void ForEachFragmentElement(const CompiledTensor& t, const CompiledFragment& f, Fn fn) {
  const int rank = f.box.rank();
  if (rank > 0 && f.box.Empty()) return;
  const DimVector gstrides = RowMajorStrides(t.shape);
  const int64_t es = DTypeSize(t.dtype);
  std::vector<int64_t> idx(rank, 0);
  while (true) {
    int64_t lin = 0, e = 0;
    for (int d = 0; d < rank; ++d) {
      lin += (f.box.offset[d] + idx[d]) * gstrides[d];
      e += idx[d] * f.strides[d];
    }
    fn(lin, f.byte_offset + e * es, idx);
    int d = rank - 1;
    while (d >= 0 && ++idx[d] == f.box.length[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

}  // namespace

int64_t SyntheticRange(v1::DType dtype) {
  switch (dtype) {
    case v1::FP8_E4M3:
    case v1::FP8_E5M2:
      return 8;
    case v1::BF16:
      return 120;
    case v1::FP16:
      return 1000;
    case v1::INT8:
      return 100;
    case v1::UINT8:
      return 200;
    case v1::BOOL:
      return 1;
    default:
      return 1000000;
  }
}

double SyntheticValue(const std::string& tensor, int64_t linear_index, int64_t range) {
  const uint64_t h = Mix(NameHash(tensor) ^ Mix(static_cast<uint64_t>(linear_index) + 0x9e37));
  return static_cast<double>(static_cast<int64_t>(h % static_cast<uint64_t>(2 * range + 1)) -
                             range);
}

absl::Status FillSource(const CompiledSide& source, int64_t range, HostMemory* mem) {
  for (const CompiledTensor& t : source.tensors) {
    const bool unsigned_t = t.dtype == v1::UINT8 || t.dtype == v1::BOOL;
    std::map<int32_t, std::vector<const CompiledFragment*>> groups;
    for (const CompiledFragment& f : t.fragments()) {
      if (f.partial_group != 0) groups[f.partial_group].push_back(&f);
    }
    for (const CompiledFragment& f : t.fragments()) {
      std::vector<uint8_t>* buf =
          mem->Find(source.workers[f.rank], v1::SOURCE_BUFFER, source.buffer_names[t.buffer(f)]);
      if (buf == nullptr) return absl::InternalError("source buffer not allocated");
      int member = 0, members = 1;
      if (f.partial_group != 0) {
        const auto& g = groups[f.partial_group];
        members = static_cast<int>(g.size());
        member = static_cast<int>(std::find(g.begin(), g.end(), &f) - g.begin());
      }
      absl::Status st;
      ForEachFragmentElement(t, f, [&](int64_t lin, int64_t at, const std::vector<int64_t>&) {
        double v = SyntheticValue(t.name, lin, range);
        if (unsigned_t) v = std::abs(v);
        if (f.partial_group != 0 && f.partial_op == v1::REDUCE_SUM) {
          double others = 0;
          for (int k = 0; k < members - 1; ++k) others += static_cast<double>((lin + k) % 3) - 1;
          v = member < members - 1 ? static_cast<double>((lin + member) % 3) - 1 : v - others;
        }
        if (st.ok()) st = WriteValue(v, t.dtype, buf->data() + at);
      });
      RETURN_IF_ERROR(st);
    }
  }
  return absl::OkStatus();
}

namespace {

// One mapping into a destination tensor: its source tensor, the source
// offset, and the destination box it lands in.
struct Entry {
  const CompiledTensor* src;
  std::vector<int64_t> src_off, dst_off, dst_len;
};

// The mappings into destination tensor t (without any: the source tensor of
// the same name, whole).
absl::StatusOr<std::vector<Entry>> EntriesOf(const v1::TransferSpec& spec,
                                             const CompiledSide& source, const CompiledTensor& t) {
  std::vector<Entry> entries;
  for (const v1::TensorMapping& m : spec.mappings()) {
    if (m.dst() != t.name) continue;
    Entry e;
    e.src = source.Find(m.src());
    if (e.src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown source ", m.src()));
    }
    e.src_off.assign(m.src_box().offset().begin(), m.src_box().offset().end());
    e.dst_off.assign(m.dst_offset().begin(), m.dst_offset().end());
    const int n = std::min(m.src_box().length_size(), static_cast<int>(t.shape.size()));
    e.dst_len.assign(t.shape.size(), 1);
    for (int k = 0; k < n; ++k) {
      e.dst_len[t.shape.size() - n + k] = m.src_box().length(m.src_box().length_size() - n + k);
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) {
    Entry e;
    e.src = source.Find(t.name);
    if (e.src == nullptr) return absl::InvalidArgumentError(absl::StrCat("no source for ", t.name));
    e.src_off.assign(t.shape.size(), 0);
    e.dst_off.assign(t.shape.size(), 0);
    e.dst_len = t.shape;
    entries.push_back(std::move(e));
  }
  return entries;
}

// The source value of a destination element under `entries` (the last
// entry covering it wins).
class WantOf {
 public:
  WantOf(const std::vector<Entry>& entries, int64_t range) : entries_(entries), range_(range) {}

  // The value of element q (global coordinates); *src is its source tensor,
  // nullptr (and 0 returned) when no entry covers q.
  double operator()(const std::vector<int64_t>& q, const CompiledTensor** src) const {
    const Entry* hit = nullptr;
    for (const Entry& e : entries_) {
      bool in = true;
      for (size_t d = 0; d < q.size(); ++d) {
        if (q[d] < e.dst_off[d] || q[d] >= e.dst_off[d] + e.dst_len[d]) in = false;
      }
      if (in) hit = &e;
    }
    *src = hit == nullptr ? nullptr : hit->src;
    if (hit == nullptr) return 0;
    const CompiledTensor& s = *hit->src;
    const int sr = static_cast<int>(s.shape.size());
    const int n = std::min<int>(sr, static_cast<int>(q.size()));
    const DimVector gs = RowMajorStrides(s.shape);
    int64_t lin = 0;
    for (int d = 0; d < sr; ++d) {
      int64_t coord = hit->src_off[d];
      if (d >= sr - n) {
        const size_t qd = q.size() - n + (d - (sr - n));
        coord = q[qd] - hit->dst_off[qd] + hit->src_off[d];
      }
      lin += coord * gs[d];
    }
    double want = SyntheticValue(s.name, lin, range_);
    if (s.dtype == v1::UINT8 || s.dtype == v1::BOOL) want = std::abs(want);
    return want;
  }

 private:
  const std::vector<Entry>& entries_;
  int64_t range_;
};

std::string JoinCoords(const std::vector<int64_t>& q) {
  std::string s;
  for (size_t d = 0; d < q.size(); ++d) absl::StrAppend(&s, d ? "," : "", q[d]);
  return s;
}

const std::vector<uint8_t>* DestinationBuffer(const CompiledSide& destination,
                                              const HostMemory& mem, int32_t worker,
                                              int32_t buffer) {
  return const_cast<HostMemory&>(mem).Find(worker, v1::DESTINATION_BUFFER,
                                           destination.buffer_names[buffer]);
}

// The documented block scale: amax / 448, or 1 for an all-zero block.
float BlockScale(float amax) { return amax == 0.0f ? 1.0f : amax / 448.0f; }

// Fragment f of block fp8 tensor t: amax per block (global block
// coordinates) over the source values, then every fp8 byte against
// FloatToFp8E4M3(value / scale).
absl::Status CheckQuantizedBytes(const CompiledTensor& t, const CompiledFragment& f, int32_t worker,
                                 const std::vector<uint8_t>& buf, const WantOf& want_of,
                                 std::map<std::vector<int64_t>, float>* amax) {
  const int rank = static_cast<int>(t.shape.size());
  absl::Status st;
  auto block_of = [&](const std::vector<int64_t>& q) {
    std::vector<int64_t> b = q;
    b[rank - 2] /= t.quant_block[0];
    b[rank - 1] /= t.quant_block[1];
    return b;
  };
  auto value = [&](const std::vector<int64_t>& idx, std::vector<int64_t>* q) -> float {
    q->resize(rank);
    for (int d = 0; d < rank; ++d) (*q)[d] = f.box.offset[d] + idx[d];
    const CompiledTensor* src = nullptr;
    const double v = want_of(*q, &src);
    if (src == nullptr && st.ok()) {
      st = absl::InternalError(absl::StrCat("tensor ", t.name, ": element not mapped"));
    }
    return static_cast<float>(v);
  };
  std::vector<int64_t> q;
  ForEachFragmentElement(t, f, [&](int64_t, int64_t, const std::vector<int64_t>& idx) {
    const float v = std::fabs(value(idx, &q));
    float& a = (*amax)[block_of(q)];
    a = std::max(a, v);
  });
  RETURN_IF_ERROR(st);
  ForEachFragmentElement(t, f, [&](int64_t, int64_t at, const std::vector<int64_t>& idx) {
    if (!st.ok()) return;
    const float v = value(idx, &q);
    const float scale = BlockScale((*amax)[block_of(q)]);
    const uint8_t want = FloatToFp8E4M3(v / scale);
    const uint8_t got = buf.data()[at];
    if (got != want) {
      st = absl::DataLossError(absl::StrCat("block-fp8 tensor '", t.name, "' on worker ", worker,
                                            " element [", JoinCoords(q), "]: got fp8 0x",
                                            absl::Hex(got), ", want 0x", absl::Hex(want),
                                            " (source value ", v, ", scale ", scale, ")"));
    }
  });
  return st;
}

// Scale fragment sf of scale tensor sc holds BlockScale(amax) of every block.
absl::Status CheckScales(const CompiledTensor& sc, const CompiledFragment& sf, int32_t worker,
                         const std::vector<uint8_t>& sbuf,
                         const std::map<std::vector<int64_t>, float>& amax) {
  for (const auto& [b, a] : amax) {
    int64_t e = 0;
    for (size_t d = 0; d < b.size(); ++d) e += (b[d] - sf.box.offset[d]) * sf.strides[d];
    float got;
    std::memcpy(&got, sbuf.data() + sf.byte_offset + 4 * e, 4);
    const float want = BlockScale(a);
    if (!(got == want)) {
      return absl::DataLossError(absl::StrCat("scale tensor '", sc.name, "' on worker ", worker,
                                              " block [", JoinCoords(b), "]: got ", got, ", want ",
                                              want));
    }
  }
  return absl::OkStatus();
}

// Block fp8 tensor `t`: every fragment (whole blocks) against a reference
// quantization of the source values written here from the documented rule
// (amax, scale = amax / 448 or 1, element / scale rounded by
// FloatToFp8E4M3), both the fp8 bytes and the scale tensor's values.
absl::Status CheckQuantized(const CompiledTensor& t, const CompiledSide& destination,
                            const HostMemory& mem, const WantOf& want_of) {
  const CompiledTensor& sc = destination.tensors[t.scale_tensor];
  for (size_t fi = 0; fi < t.num_fragments(); ++fi) {
    const CompiledFragment& f = t.fragment(fi);
    if (f.box.Empty()) continue;
    const int32_t worker = destination.workers[f.rank];
    const CompiledFragment& sf = sc.fragment(t.scale_fragment[fi]);
    const std::vector<uint8_t>* buf = DestinationBuffer(destination, mem, worker, t.buffer(f));
    const std::vector<uint8_t>* sbuf = DestinationBuffer(destination, mem, worker, sc.buffer(sf));
    if (buf == nullptr || sbuf == nullptr) {
      return absl::InternalError("destination buffer not allocated");
    }
    std::map<std::vector<int64_t>, float> amax;
    RETURN_IF_ERROR(CheckQuantizedBytes(t, f, worker, *buf, want_of, &amax));
    RETURN_IF_ERROR(CheckScales(sc, sf, worker, *sbuf, amax));
  }
  return absl::OkStatus();
}

// Every element of fragment f of (unquantized) tensor t equals its want.
absl::Status CheckFragment(const CompiledTensor& t, const CompiledFragment& f, int32_t worker,
                           const std::vector<uint8_t>& buf, const WantOf& want_of) {
  absl::Status st;
  ForEachFragmentElement(t, f, [&](int64_t, int64_t at, const std::vector<int64_t>& idx) {
    if (!st.ok()) return;
    std::vector<int64_t> q(idx.size());
    for (size_t d = 0; d < idx.size(); ++d) q[d] = f.box.offset[d] + idx[d];
    const CompiledTensor* src = nullptr;
    const double want = want_of(q, &src);
    if (src == nullptr) {
      st = absl::InternalError(absl::StrCat("tensor ", t.name, ": element not mapped"));
      return;
    }
    const double got = ReadElement(t.dtype, buf.data() + at);
    if (got != want) {
      st = absl::DataLossError(absl::StrCat("destination tensor '", t.name, "' on worker ", worker,
                                            " element [", JoinCoords(q), "]: got ", got, ", want ",
                                            want, " (from '", src->name, "')"));
    }
  });
  return st;
}

}  // namespace

absl::Status CheckDestination(const v1::TransferSpec& spec, const CompiledSide& source,
                              const CompiledSide& destination, int64_t range,
                              const HostMemory& mem) {
  for (const CompiledTensor& t : destination.tensors) {
    if (t.scales_for >= 0) continue;  // checked with its quantized tensor
    ASSIGN_OR_RETURN(const std::vector<Entry> entries, EntriesOf(spec, source, t));
    const WantOf want_of(entries, range);
    if (t.quantized()) {
      RETURN_IF_ERROR(CheckQuantized(t, destination, mem, want_of));
      continue;
    }
    for (const CompiledFragment& f : t.fragments()) {
      const int32_t worker = destination.workers[f.rank];
      const std::vector<uint8_t>* buf = DestinationBuffer(destination, mem, worker, t.buffer(f));
      if (buf == nullptr) return absl::InternalError("destination buffer not allocated");
      RETURN_IF_ERROR(CheckFragment(t, f, worker, *buf, want_of));
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan
