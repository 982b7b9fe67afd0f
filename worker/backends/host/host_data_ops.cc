#include "worker/backends/host/host_data_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/block_fp8.h"
#include "common/cast.h"
#include "common/status_macros.h"

namespace wsync::exec {
namespace {

constexpr int64_t kChunkElements = 1 << 16;

uint8_t* Bytes(void* p) { return static_cast<uint8_t*>(p); }
const uint8_t* Bytes(const void* p) { return static_cast<const uint8_t*>(p); }

StridedView ContiguousView(const void* data, DType dtype, int64_t n) {
  StridedView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.ndim = 1;
  v.shape[0] = n;
  v.strides[0] = 1;
  return v;
}

// Calls fn(element_ptr, run_length, run_stride_elements) over the runs along
// the innermost dim that cover elements [begin, begin + count) in row-major
// order.
template <typename Fn>
void ForEachRun(const StridedView& v, int64_t begin, int64_t count, Fn fn) {
  const int64_t esize = DTypeSize(v.dtype);
  const int last = v.ndim - 1;
  int64_t idx[kMaxViewDims];
  int64_t rem = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % v.shape[d];
    rem /= v.shape[d];
  }
  while (count > 0) {
    int64_t offset = 0;
    for (int d = 0; d <= last; ++d) offset += idx[d] * v.strides[d];
    const int64_t len = std::min(count, v.shape[last] - idx[last]);
    fn(Bytes(v.data) + offset * esize, len, v.strides[last]);
    count -= len;
    idx[last] += len;
    for (int d = last; d > 0 && idx[d] == v.shape[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// Element by element through memcpy: a view's byte offset need not be a
// multiple of its element size (a plan may place one anywhere), and a typed
// load there would be undefined (found by plan_part_fuzzer under UBSan).
template <typename T>
void StridedGather(const uint8_t* src, int64_t len, int64_t stride, uint8_t* out) {
  const int64_t step = stride * static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < len; ++i) std::memcpy(out + i * sizeof(T), src + i * step, sizeof(T));
}

template <typename T>
void StridedScatter(const uint8_t* in, int64_t len, int64_t stride, uint8_t* dst) {
  const int64_t step = stride * static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < len; ++i) std::memcpy(dst + i * step, in + i * sizeof(T), sizeof(T));
}

// Elements [begin, begin + count) of v -> out (contiguous).
void Gather(const StridedView& v, int64_t begin, int64_t count, uint8_t* out) {
  const int64_t esize = DTypeSize(v.dtype);
  ForEachRun(v, begin, count, [&](uint8_t* p, int64_t len, int64_t stride) {
    if (stride == 1) {
      std::memcpy(out, p, len * esize);
    } else {
      switch (esize) {
        case 1:
          StridedGather<uint8_t>(p, len, stride, out);
          break;
        case 2:
          StridedGather<uint16_t>(p, len, stride, out);
          break;
        case 4:
          StridedGather<uint32_t>(p, len, stride, out);
          break;
        default:
          StridedGather<uint64_t>(p, len, stride, out);
          break;
      }
    }
    out += len * esize;
  });
}

// in (contiguous) -> elements [begin, begin + count) of v.
void Scatter(const uint8_t* in, const StridedView& v, int64_t begin, int64_t count) {
  const int64_t esize = DTypeSize(v.dtype);
  ForEachRun(v, begin, count, [&](uint8_t* p, int64_t len, int64_t stride) {
    if (stride == 1) {
      std::memcpy(p, in, len * esize);
    } else {
      switch (esize) {
        case 1:
          StridedScatter<uint8_t>(in, len, stride, p);
          break;
        case 2:
          StridedScatter<uint16_t>(in, len, stride, p);
          break;
        case 4:
          StridedScatter<uint32_t>(in, len, stride, p);
          break;
        default:
          StridedScatter<uint64_t>(in, len, stride, p);
          break;
      }
    }
    in += len * esize;
  });
}

absl::Status CheckView(const StridedView& v, const char* what) {
  if (DTypeSize(v.dtype) == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no dtype"));
  if (v.ndim < 1 || v.ndim > kMaxViewDims) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad ndim ", v.ndim));
  }
  if (v.data == nullptr && v.num_elements() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null data"));
  }
  return absl::OkStatus();
}

void EnsureSize(std::vector<uint8_t>& v, size_t bytes) {
  if (v.size() < bytes) v.resize(bytes);
}

}  // namespace

absl::StatusOr<StagingBuffer> HostDataOps::AllocateStaging(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative staging size ", bytes));
  if (bytes == 0) return StagingBuffer();
  constexpr int64_t kAlign = 256;
  const int64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, static_cast<size_t>(rounded));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host staging"));
  }
  // Touched once now (a warm-up allocates it): its pages fault here, not in
  // the first sync's rounds (docs/warm-up.md).
  std::memset(p, 0, static_cast<size_t>(rounded));
  return StagingBuffer(p, bytes, [](void* q) { std::free(q); });
}

absl::Status HostDataOps::Transfer(const StridedView& src, const StridedView& dst) {
  const int64_t n = src.num_elements();
  if (n != dst.num_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("element count mismatch: ", n, " vs ", dst.num_elements()));
  }
  if (!CanConvert(src.dtype, dst.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("no conversion from ", DTypeName(src.dtype), " to ", DTypeName(dst.dtype)));
  }
  const bool sc = src.contiguous(), dc = dst.contiguous();
  if (sc && dc) return ConvertElements(src.data, src.dtype, dst.data, dst.dtype, n);
  const int64_t ssize = DTypeSize(src.dtype), dsize = DTypeSize(dst.dtype);
  if (src.dtype == dst.dtype) {  // no conversion: one gather or scatter pass
    if (dc) {
      Gather(src, 0, n, Bytes(dst.data));
      return absl::OkStatus();
    }
    if (sc) {
      Scatter(Bytes(src.data), dst, 0, n);
      return absl::OkStatus();
    }
  }
  EnsureSize(scratch_src_, kChunkElements * ssize);
  EnsureSize(scratch_dst_, kChunkElements * dsize);
  for (int64_t pos = 0; pos < n; pos += kChunkElements) {
    const int64_t len = std::min(kChunkElements, n - pos);
    const uint8_t* s = Bytes(src.data) + pos * ssize;
    if (!sc) {
      Gather(src, pos, len, scratch_src_.data());
      s = scratch_src_.data();
    }
    uint8_t* d = dc ? Bytes(dst.data) + pos * dsize : scratch_dst_.data();
    RETURN_IF_ERROR(ConvertElements(s, src.dtype, d, dst.dtype, len));
    if (!dc) Scatter(d, dst, pos, len);
  }
  return absl::OkStatus();
}

absl::Status HostDataOps::Pack(absl::Span<const PackItem> items, void* staging_base) {
  for (size_t i = 0; i < items.size(); ++i) {
    const PackItem& it = items[i];
    absl::Status s = CheckView(it.src, "pack source");
    const int64_t n = it.src.num_elements();
    if (s.ok() && staging_base == nullptr && n > 0) s = absl::InvalidArgumentError("null staging");
    if (s.ok() && it.quant_block_rows > 0) {
      s = PackQuantized(it, staging_base);
    } else if (s.ok()) {
      s = Transfer(it.src,
                   ContiguousView(Bytes(staging_base) + it.staging_offset, it.wire_dtype, n));
    }
    if (!s.ok()) return ItemError(s, "pack", i);
  }
  return absl::OkStatus();
}

absl::Status HostDataOps::Unpack(const void* staging_base, absl::Span<const UnpackItem> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    const UnpackItem& it = items[i];
    absl::Status s = CheckView(it.dst, "unpack destination");
    const int64_t n = it.dst.num_elements();
    if (s.ok() && staging_base == nullptr && n > 0) s = absl::InvalidArgumentError("null staging");
    if (s.ok()) {
      s = Transfer(ContiguousView(Bytes(staging_base) + it.staging_offset, it.wire_dtype, n),
                   it.dst);
    }
    if (!s.ok()) return ItemError(s, "unpack", i);
  }
  return absl::OkStatus();
}

absl::Status HostDataOps::CheckCopyItem(const CopyItem& item) {
  RETURN_IF_ERROR(CheckView(item.src, "copy source"));
  RETURN_IF_ERROR(CheckView(item.dst, "copy destination"));
  if (item.src.num_elements() != item.dst.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "element count mismatch: ", item.src.num_elements(), " vs ", item.dst.num_elements()));
  }
  if (!CanConvert(item.src.dtype, item.dst.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("no conversion from ", DTypeName(item.src.dtype),
                                                   " to ", DTypeName(item.dst.dtype)));
  }
  return absl::OkStatus();
}

absl::Status HostDataOps::Copy(absl::Span<const CopyItem> items, ItemsHandle handle) {
  (void)handle;
  for (size_t i = 0; i < items.size(); ++i) {
    absl::Status s = CheckView(items[i].src, "copy source");
    if (s.ok()) s = CheckView(items[i].dst, "copy destination");
    if (s.ok()) s = Transfer(items[i].src, items[i].dst);
    if (!s.ok()) return ItemError(s, "copy", i);
  }
  return absl::OkStatus();
}

absl::Status HostDataOps::Reduce(absl::Span<const ReduceInput> inputs,
                                 absl::Span<const ReduceItem> items, const void* staging_base) {
  for (size_t i = 0; i < items.size(); ++i) {
    const ReduceItem& it = items[i];
    auto fail = [&](const absl::Status& s) { return ItemError(s, "reduce", i); };
    RETURN_IF_ERROR(fail(CheckView(it.dst, "reduce destination")));
    if (it.num_inputs < 1 || it.input_begin < 0 ||
        static_cast<size_t>(it.input_begin) + it.num_inputs > inputs.size()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "inputs [", it.input_begin, ", +", it.num_inputs, ") outside ", inputs.size())));
    }
    const DType acc = it.accumulate_dtype;
    const int64_t asize = DTypeSize(acc);
    const int64_t n = it.dst.num_elements();
    std::vector<StridedView> views(it.num_inputs);
    for (int k = 0; k < it.num_inputs; ++k) {
      const ReduceInput& in = inputs[it.input_begin + k];
      StridedView v = in.view;
      if (in.staging_offset >= 0) {
        if (staging_base == nullptr && n > 0) {
          return fail(absl::InvalidArgumentError("staged reduce input but null staging"));
        }
        v = ContiguousView(Bytes(staging_base) + in.staging_offset, in.view.dtype, n);
      }
      RETURN_IF_ERROR(fail(CheckView(v, "reduce input")));
      if (v.num_elements() != n) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("input ", k, " has ", v.num_elements(), " elements, destination ", n)));
      }
      if (!CanConvert(v.dtype, acc)) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "input ", k, ": no conversion from ", DTypeName(v.dtype), " to ", DTypeName(acc))));
      }
      views[k] = v;
    }
    if (scratch_inputs_.size() < views.size()) scratch_inputs_.resize(views.size());
    if (!CanConvert(acc, it.dst.dtype)) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("no conversion from ", DTypeName(acc), " to ", DTypeName(it.dst.dtype))));
    }
    std::vector<const void*> ptrs(views.size());
    EnsureSize(scratch_dst_, kChunkElements * asize);
    EnsureSize(scratch_out_, kChunkElements * DTypeSize(it.dst.dtype));
    for (int64_t pos = 0; pos < n; pos += kChunkElements) {
      const int64_t len = std::min(kChunkElements, n - pos);
      for (size_t k = 0; k < views.size(); ++k) {
        const StridedView& v = views[k];
        const int64_t vsize = DTypeSize(v.dtype);
        if (v.contiguous() && v.dtype == acc) {
          ptrs[k] = Bytes(v.data) + pos * vsize;
          continue;
        }
        std::vector<uint8_t>& buf = scratch_inputs_[k];
        EnsureSize(buf, kChunkElements * (vsize + asize));
        const uint8_t* raw = Bytes(v.data) + pos * vsize;
        if (!v.contiguous()) {
          Gather(v, pos, len, buf.data());
          raw = buf.data();
        }
        uint8_t* converted = buf.data() + kChunkElements * vsize;
        RETURN_IF_ERROR(fail(ConvertElements(raw, v.dtype, converted, acc, len)));
        ptrs[k] = converted;
      }
      RETURN_IF_ERROR(fail(ReduceElements(ptrs, acc, it.op, scratch_dst_.data(), len)));
      const int64_t dsize = DTypeSize(it.dst.dtype);
      uint8_t* out = it.dst.contiguous() ? Bytes(it.dst.data) + pos * dsize : scratch_out_.data();
      RETURN_IF_ERROR(fail(ConvertElements(scratch_dst_.data(), acc, out, it.dst.dtype, len)));
      if (!it.dst.contiguous()) Scatter(out, it.dst, pos, len);
    }
  }
  return absl::OkStatus();
}

absl::Status HostDataOps::PackQuantized(const PackItem& it, void* staging_base) {
  BlockGrid g;
  g.outer = it.quant_outer;
  g.rows = it.quant_rows;
  g.cols = it.quant_cols;
  g.block_rows = it.quant_block_rows;
  g.block_cols = it.quant_block_cols;
  const int64_t n = it.src.num_elements();
  if (it.wire_dtype != v1::FP8_E4M3 || g.num_elements() != n || g.block_cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized pack of ", n, " elements as [", g.outer, ", ", g.rows, ", ", g.cols,
                     "] to ", DTypeName(it.wire_dtype), ": needs FP8_E4M3 and a matching grid"));
  }
  quant_in_.resize(n);
  RETURN_IF_ERROR(Transfer(it.src, ContiguousView(quant_in_.data(), v1::FP32, n)));
  // Scales may sit unaligned in staging: quantize into scratch, then copy.
  quant_scales_.resize(g.num_blocks());
  RETURN_IF_ERROR(QuantizeBlocksFp8E4M3(
      quant_in_.data(), g, Bytes(staging_base) + it.staging_offset, quant_scales_.data()));
  std::memcpy(Bytes(staging_base) + it.scale_offset, quant_scales_.data(),
              quant_scales_.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status HostDataOps::Quantize(absl::Span<const QuantizeInput> inputs,
                                   absl::Span<const QuantizeItem> items, const void* staging_base) {
  for (size_t i = 0; i < items.size(); ++i) {
    const QuantizeItem& q = items[i];
    auto fail = [&](const absl::Status& s) { return ItemError(s, "quantize", i); };
    const int nd = q.dst.ndim;
    if (q.dst.dtype != v1::FP8_E4M3 || nd < 2 || q.scale_dst.dtype != v1::FP32 ||
        q.input_begin < 0 || q.num_inputs < 0 ||
        static_cast<size_t>(q.input_begin) + q.num_inputs > inputs.size()) {
      return fail(absl::InvalidArgumentError(
          "needs an FP8_E4M3 destination of >= 2 dims, FP32 scales and inputs in range"));
    }
    BlockGrid g;
    for (int d = 0; d + 2 < nd; ++d) g.outer *= q.dst.shape[d];
    g.rows = q.dst.shape[nd - 2];
    g.cols = q.dst.shape[nd - 1];
    g.block_rows = q.block_rows;
    g.block_cols = q.block_cols;
    const int64_t n = g.num_elements();
    if (q.scale_dst.num_elements() != g.num_blocks()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("scale destination holds ", q.scale_dst.num_elements(), " values for ",
                       g.num_blocks(), " blocks")));
    }
    quant_in_.assign(n, 0.0f);
    int64_t filled = 0;
    for (int32_t k = q.input_begin; k < q.input_begin + q.num_inputs; ++k) {
      const QuantizeInput& in = inputs[k];
      StridedView v = in.view;
      if (in.staging_offset >= 0) {
        if (staging_base == nullptr) return fail(absl::InvalidArgumentError("null staging"));
        v = ContiguousView(Bytes(staging_base) + in.staging_offset, in.view.dtype,
                           in.view.num_elements());
      }
      int64_t m = 1;
      for (int d = 0; d < nd; ++d) {
        if (in.offset[d] < 0 || in.shape[d] < 0 || in.offset[d] + in.shape[d] > q.dst.shape[d]) {
          return fail(absl::InvalidArgumentError(absl::StrCat("input ", k, " lies outside")));
        }
        m *= in.shape[d];
      }
      if (m != v.num_elements()) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("input ", k, " has ", v.num_elements(), " elements for a box of ", m)));
      }
      // The input's box inside the row-major region: a strided fp32 view.
      StridedView place;
      place.dtype = v1::FP32;
      place.ndim = nd;
      int64_t stride = 1, first = 0;
      for (int d = nd - 1; d >= 0; --d) {
        place.shape[d] = in.shape[d];
        place.strides[d] = stride;
        first += in.offset[d] * stride;
        stride *= q.dst.shape[d];
      }
      place.data = quant_in_.data() + first;
      RETURN_IF_ERROR(Transfer(v, place));
      filled += m;
    }
    if (filled != n) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("inputs fill ", filled, " of the region's ", n, " elements")));
    }
    quant_out_.resize(n);
    quant_scales_.resize(g.num_blocks());
    RETURN_IF_ERROR(
        QuantizeBlocksFp8E4M3(quant_in_.data(), g, quant_out_.data(), quant_scales_.data()));
    absl::Status s = Transfer(ContiguousView(quant_out_.data(), v1::FP8_E4M3, n), q.dst);
    if (s.ok()) {
      s = Transfer(ContiguousView(quant_scales_.data(), v1::FP32, g.num_blocks()), q.scale_dst);
    }
    if (!s.ok()) return fail(s);
  }
  return absl::OkStatus();
}

}  // namespace wsync::exec
