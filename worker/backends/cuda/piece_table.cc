#include "worker/backends/cuda/piece_table.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace wsync::cuda {
namespace {

// A piece with `n` dims (shape, source and destination strides), right-aligned
// in the descriptor's kMaxPieceDims; the rest stays as PieceDesc sets it.
PieceDesc PieceOfDims(const int64_t* shape, const int64_t* src_strides, const int64_t* dst_strides,
                      int n) {
  PieceDesc p;
  const int off = kMaxPieceDims - n;
  for (int d = 0; d < n; ++d) {
    p.shape[off + d] = shape[d];
    p.src_stride[off + d] = src_strides[d];
    p.dst_stride[off + d] = dst_strides[d];
  }
  return p;
}

bool Aligned16(uint64_t address) { return (address & 15u) == 0; }

std::string DimsString(const int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) absl::StrAppend(&s, i ? "," : "", v[i]);
  return s + "]";
}

}  // namespace

bool KernelSupportsCast(DType from, DType to) {
  if (DTypeSize(from) == 0 || DTypeSize(to) == 0) return false;
  return from == to || (IsFloatingPoint(from) && IsFloatingPoint(to));
}

int NormalizeDims(int64_t* shape, int ndim, int64_t** strides, int num_strides) {
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return 0;
  }
  // Walk from the innermost dim outwards, folding a dim into the kept inner
  // one when every view steps over the inner dim contiguously. Output is
  // written right-aligned, then shifted left.
  int out = ndim;  // next free slot is out - 1
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = out < ndim;
    for (int k = 0; merge && k < num_strides; ++k) {
      merge = strides[k][d] == strides[k][out] * shape[out];
    }
    if (merge) {
      shape[out] *= shape[d];
      continue;
    }
    --out;
    shape[out] = shape[d];
    for (int k = 0; k < num_strides; ++k) strides[k][out] = strides[k][d];
  }
  if (out == ndim) {  // a single element
    shape[0] = 1;
    for (int k = 0; k < num_strides; ++k) strides[k][0] = 1;
    return 1;
  }
  const int n = ndim - out;
  for (int i = 0; i < n; ++i) {
    shape[i] = shape[out + i];
    for (int k = 0; k < num_strides; ++k) strides[k][i] = strides[k][out + i];
  }
  return n;
}

void PieceTable::Clear() {
  pieces_.clear();
  tasks_.clear();
  inputs_.clear();
  bytes_written_ = 0;
  non_copy_pieces_ = 0;
}

void PieceTable::Append(const PieceDesc& p) {
  const auto index = static_cast<int32_t>(pieces_.size());
  pieces_.push_back(p);
  if (p.mode != kModeVecCopy && p.mode != kModeRawCopy) ++non_copy_pieces_;
  AddTasks(index, p);
  bytes_written_ += p.shape[0] * p.shape[1] * p.shape[2] * p.shape[3] * p.dst_esize;
}

void PieceTable::AddTasks(int32_t piece_index, const PieceDesc& p) {
  const int64_t rows = p.shape[0] * p.shape[1] * p.shape[2];
  const int64_t cols = p.shape[3];
  if (cols >= kTaskElements) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; c += kTaskElements) {
        tasks_.push_back(TaskDesc{r, 1, c, std::min(kTaskElements, cols - c), piece_index, 0});
      }
    }
    return;
  }
  const int64_t rows_per_task = std::max<int64_t>(1, kTaskElements / cols);
  for (int64_t r = 0; r < rows; r += rows_per_task) {
    tasks_.push_back(TaskDesc{r, std::min(rows_per_task, rows - r), 0, cols, piece_index, 0});
  }
}

absl::Status PieceTable::AddNormalizedCopy(const char* src, DType sd, const int64_t* ss, char* dst,
                                           DType dd, const int64_t* ds, const int64_t* shape,
                                           int ndim) {
  if (ndim > kMaxPieceDims) {
    // More irreducible dims than the kernel walks: peel the outermost one.
    const int64_t se = DTypeSize(sd), de = DTypeSize(dd);
    for (int64_t i = 0; i < shape[0]; ++i) {
      absl::Status s = AddNormalizedCopy(src + i * ss[0] * se, sd, ss + 1, dst + i * ds[0] * de, dd,
                                         ds + 1, shape + 1, ndim - 1);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  PieceDesc p = PieceOfDims(shape, ss, ds, ndim);
  p.src = reinterpret_cast<uint64_t>(src);
  p.dst = reinterpret_cast<uint64_t>(dst);
  p.src_dtype = sd;
  p.dst_dtype = dd;
  p.src_esize = static_cast<int32_t>(DTypeSize(sd));
  p.dst_esize = static_cast<int32_t>(DTypeSize(dd));
  if (sd != dd) {
    p.mode = kModeCastCopy;
  } else {
    const int64_t es = p.src_esize;
    const int64_t unit = 16 / es;
    bool vec = p.src_stride[3] == 1 && p.dst_stride[3] == 1 && p.shape[3] % unit == 0 &&
               Aligned16(p.src) && Aligned16(p.dst);
    for (int d = 0; d < 3 && vec; ++d) {
      if (p.shape[d] > 1) {
        vec = (p.src_stride[d] * es) % 16 == 0 && (p.dst_stride[d] * es) % 16 == 0;
      }
    }
    p.mode = vec ? kModeVecCopy : kModeRawCopy;
  }
  if (pieces_.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::ResourceExhaustedError("piece table full");
  }
  Append(p);
  return absl::OkStatus();
}

absl::Status PieceTable::AddCopy(const ViewRef& src, const ViewRef& dst, const int64_t* shape,
                                 int ndim, const char* label) {
  if (ndim < 0 || ndim > kMaxRequestDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy ", label, ": ", ndim, " dims (max ", kMaxRequestDims, ")"));
  }
  if (!KernelSupportsCast(src.dtype, dst.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("copy ", label, ": no conversion from ",
                                                   DTypeName(src.dtype), " to ",
                                                   DTypeName(dst.dtype)));
  }
  int64_t sh[kMaxRequestDims], ss[kMaxRequestDims], ds[kMaxRequestDims];
  for (int d = 0; d < ndim; ++d) {
    sh[d] = shape[d];
    ss[d] = src.strides[d];
    ds[d] = dst.strides[d];
    if (sh[d] < 0 || ss[d] < 0 || ds[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy ", label, ": negative shape or stride: shape ",
                       DimsString(shape, ndim), " src strides ", DimsString(src.strides, ndim),
                       " dst strides ", DimsString(dst.strides, ndim)));
    }
  }
  int64_t* strides[2] = {ss, ds};
  const int n = ndim == 0 ? (sh[0] = ss[0] = ds[0] = 1) : NormalizeDims(sh, ndim, strides, 2);
  if (n == 0) return absl::OkStatus();
  if (src.data == nullptr || dst.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy ", label, ": null ", src.data ? "destination" : "source"));
  }
  return AddNormalizedCopy(static_cast<const char*>(src.data), src.dtype, ss,
                           static_cast<char*>(const_cast<void*>(dst.data)), dst.dtype, ds, sh, n);
}

absl::Status PieceTable::AddReduce(const void* const* inputs, int num_inputs, DType input_dtype,
                                   DType accumulate_dtype, v1::ReduceOp op, const ViewRef& dst,
                                   const int64_t* shape, int ndim, const char* label) {
  if (ndim < 0 || ndim > kMaxRequestDims) {
    return absl::InvalidArgumentError(absl::StrCat("reduce ", label, ": ", ndim, " dims"));
  }
  if (num_inputs <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("reduce ", label, ": no inputs"));
  }
  if (op != v1::REDUCE_SUM && op != v1::REDUCE_AVG) {
    return absl::InvalidArgumentError(absl::StrCat("reduce ", label, ": unknown op ", op));
  }
  const bool is_float = IsFloatingPoint(accumulate_dtype);
  if (!KernelSupportsCast(input_dtype, accumulate_dtype) ||
      !KernelSupportsCast(accumulate_dtype, dst.dtype) || accumulate_dtype == v1::BOOL ||
      (!is_float && op == v1::REDUCE_AVG)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce ", label, ": ", v1::ReduceOp_Name(op), " of ", DTypeName(input_dtype),
                     " accumulated in ", DTypeName(accumulate_dtype), " into ",
                     DTypeName(dst.dtype), " is not defined"));
  }
  for (int i = 0; i < num_inputs; ++i) {
    if (inputs[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("reduce ", label, ": input ", i, " is null"));
    }
  }
  int64_t sh[kMaxRequestDims], is[kMaxRequestDims], ds[kMaxRequestDims];
  for (int d = 0; d < ndim; ++d) {
    sh[d] = shape[d];
    ds[d] = dst.strides[d];
    if (sh[d] < 0 || ds[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce ", label, ": negative shape or stride"));
    }
  }
  // Inputs are contiguous row-major over the full shape.
  if (ndim > 0) is[ndim - 1] = 1;
  for (int d = ndim - 2; d >= 0; --d) is[d] = is[d + 1] * sh[d + 1];
  int64_t* strides[2] = {is, ds};
  const int n = ndim == 0 ? (sh[0] = is[0] = ds[0] = 1) : NormalizeDims(sh, ndim, strides, 2);
  if (n == 0) return absl::OkStatus();
  if (n > kMaxPieceDims) {
    return absl::UnimplementedError(absl::StrCat("reduce ", label, ": destination view has ", n,
                                                 " irreducible dims (GPU reduce walks at most ",
                                                 kMaxPieceDims, ")"));
  }
  if (dst.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("reduce ", label, ": null destination"));
  }
  PieceDesc p = PieceOfDims(sh, is, ds, n);
  p.mode = kModeReduce;
  p.src = inputs_.size();
  for (int i = 0; i < num_inputs; ++i) inputs_.push_back(reinterpret_cast<uint64_t>(inputs[i]));
  p.dst = reinterpret_cast<uint64_t>(dst.data);
  p.src_dtype = input_dtype;
  p.dst_dtype = dst.dtype;
  p.acc_dtype = accumulate_dtype;
  p.num_inputs = num_inputs;
  p.average = op == v1::REDUCE_AVG ? 1 : 0;
  p.src_esize = static_cast<int32_t>(DTypeSize(input_dtype));
  p.dst_esize = static_cast<int32_t>(DTypeSize(dst.dtype));
  Append(p);
  return absl::OkStatus();
}

}  // namespace wsync::cuda
