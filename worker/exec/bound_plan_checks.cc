// View resolution and the piece checks the Bind* methods share.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "worker/exec/bound_plan_internal.h"

namespace wsync::exec::bind_internal {

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

std::string ShapeString(const v1::TensorView& v) {
  return absl::StrCat("[", absl::StrJoin(v.shape(), ","), "]");
}

absl::StatusOr<StridedView> Binder::Resolve(const v1::TensorView& v, BufferSide role,
                                            const char* which, const BufferRegistry* peer) const {
  const BufferSide side = SideOf(v);
  ASSIGN_OR_RETURN(const std::string* name,
                   PlanName(plan_, v.buffer_name(), absl::StrCat(which, " view")));
  const std::string what = absl::StrCat(which, " view of ", BufferSideName(side), " buffer '",
                                        *name, "'", peer != nullptr ? " of the peer" : "");
  // Writes only ever go to destination buffers: never into the trainer's.
  if (role == BufferSide::kDestination && side != BufferSide::kDestination) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a written view must name a ", "destination buffer"));
  }
  const RegisteredBuffer* buf = (peer != nullptr ? *peer : registry_).Find(side, *name);
  if (buf == nullptr) return absl::NotFoundError(absl::StrCat(what, ": buffer not registered"));
  if (v.dtype() != buf->dtype) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": view dtype ", DTypeName(v.dtype()),
                                                   " but the buffer is registered as ",
                                                   DTypeName(buf->dtype)));
  }
  if (buf->space != space_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": buffer lives in another memory space than the data ops"));
  }
  const int64_t esize = DTypeSize(v.dtype());
  if (v.shape_size() != v.strides_size() || v.byte_offset() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed view (shape ", ShapeString(v),
                                                   ", ", v.strides_size(), " strides, offset ",
                                                   v.byte_offset(), ")"));
  }
  // The element count too: a stride-0 view spans little but may count more
  // elements than int64 holds (every later size is numel * element size).
  for (int d = 0; d < v.shape_size(); ++d) {
    if (v.shape(d) < 0 || v.strides(d) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": negative size or stride"));
    }
  }
  RETURN_IF_ERROR(CheckedNumElements(v.shape(), what).status());
  absl::StatusOr<int64_t> span = StridedExtent(v.shape(), v.strides(), esize, what);
  if (!span.ok()) return absl::OutOfRangeError(span.status().message());
  absl::StatusOr<int64_t> end = CheckedAdd(v.byte_offset(), *span, what);
  if (!end.ok()) return absl::OutOfRangeError(end.status().message());
  if (*end > buf->bytes) {
    return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", v.byte_offset(), ", ", *end,
                                              ") of shape ", ShapeString(v),
                                              " lie outside the buffer's ", buf->bytes, " bytes"));
  }
  std::vector<int64_t> shape(v.shape().begin(), v.shape().end());
  std::vector<int64_t> strides(v.strides().begin(), v.strides().end());
  auto view = MakeStridedView(static_cast<uint8_t*>(buf->data) + v.byte_offset(), v.dtype(), shape,
                              strides);
  if (!view.ok()) return Annotate(view.status(), what);
  return view;
}

bool SameShape(const StridedView& a, const StridedView& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d]) return false;
  }
  return true;
}

absl::Status CheckPacked(const v1::Bucket& b, const v1::Piece& p, int64_t numel) {
  const int64_t wsize = DTypeSize(p.wire_dtype());
  if (wsize == 0) return absl::InvalidArgumentError("piece has no wire dtype");
  ASSIGN_OR_RETURN(const int64_t bytes, CheckedMul(numel, wsize, "packed piece"));
  absl::Status in = RangeWithin(p.bucket_offset(), bytes, b.bytes(), "packed bytes");
  if (!in.ok()) {
    return absl::OutOfRangeError(
        absl::StrCat(in.message(), " (the bucket's ", b.bytes(), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status StagedInput(const v1::Bucket& b, const v1::Piece& p, int64_t transfer_offset,
                         const char* kind, StridedView* view, int64_t* staging_offset) {
  if (b.zero_copy()) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " in a zero-copy bucket"));
  }
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumElements(p.dst().shape(), kind));
  RETURN_IF_ERROR(CheckPacked(b, p, numel));
  ASSIGN_OR_RETURN(*staging_offset, CheckedAdd(transfer_offset, p.bucket_offset(), kind));
  view->dtype = p.wire_dtype();
  view->ndim = 1;
  view->shape[0] = numel;
  view->strides[0] = 1;
  return absl::OkStatus();
}

absl::Status CheckSameCount(const v1::Piece& p) {
  ASSIGN_OR_RETURN(const int64_t a, CheckedNumElements(p.src().shape(), "source view"));
  ASSIGN_OR_RETURN(const int64_t b, CheckedNumElements(p.dst().shape(), "destination view"));
  if (a != b) {
    return absl::InvalidArgumentError(absl::StrCat("source shape ", ShapeString(p.src()),
                                                   " and destination shape ", ShapeString(p.dst()),
                                                   " hold different element counts"));
  }
  return absl::OkStatus();
}

absl::Status CheckZeroCopyShape(const v1::Bucket& b) {
  if (b.pieces_size() != 1 || b.runs_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("zero-copy bucket has ", b.pieces_size(),
                                                   " pieces and ", b.runs_size(),
                                                   " runs, needs exactly 1 piece"));
  }
  return absl::OkStatus();
}

absl::Status CheckZeroCopy(const v1::Bucket& b, StridedView v) {
  StridedView* one[] = {&v};
  CoalesceViews(one);
  RETURN_IF_ERROR(CheckZeroCopyShape(b));
  const v1::Piece& p = b.pieces(0);
  if (!v.contiguous() || v.dtype != p.wire_dtype() ||
      v.num_elements() * DTypeSize(v.dtype) != b.bytes() || p.bucket_offset() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero-copy bucket needs a contiguous ", DTypeName(p.wire_dtype()), " view of exactly ",
        b.bytes(), " bytes; the view is ", v.contiguous() ? "" : "strided, ", DTypeName(v.dtype),
        ", ", v.num_elements() * DTypeSize(v.dtype), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantGridInfo> QuantGrid(const v1::Bucket& b, int i) {
  const v1::Piece& p = b.pieces(i);
  QuantGridInfo g;
  const int nd = p.dst().shape_size();
  if (p.quant_block_size() != 2 || nd < 2 || p.quant_block(0) <= 0 || p.quant_block(1) <= 0 ||
      p.wire_dtype() != v1::FP8_E4M3) {
    return absl::InvalidArgumentError(
        "quantized piece needs 2 positive blocks, a destination of >= 2 dims and wire FP8_E4M3");
  }
  ASSIGN_OR_RETURN(g.outer, CheckedNumElements(absl::MakeConstSpan(p.dst().shape()).first(nd - 2),
                                               "quantized piece"));
  g.rows = p.dst().shape(nd - 2);
  g.cols = p.dst().shape(nd - 1);
  g.block_rows = p.quant_block(0);
  g.block_cols = p.quant_block(1);
  if (g.rows < 0 || g.cols < 0) {
    return absl::InvalidArgumentError("quantized piece has a negative dimension");
  }
  for (int k = 0; k < b.pieces_size(); ++k) {
    if (b.pieces(k).scales_of() == i + 1) {
      if (g.scale_piece >= 0) return absl::InvalidArgumentError("two scale pieces");
      g.scale_piece = k;
    }
  }
  if (g.scale_piece < 0) return absl::InvalidArgumentError("no scale piece");
  const v1::Piece& sp = b.pieces(g.scale_piece);
  // ceil(n / block) without forming n + block - 1.
  const int64_t block_rows = g.rows / g.block_rows + (g.rows % g.block_rows != 0);
  const int64_t block_cols = g.cols / g.block_cols + (g.cols % g.block_cols != 0);
  ASSIGN_OR_RETURN(const int64_t blocks,
                   CheckedNumElements({g.outer, block_rows, block_cols}, "quantized piece"));
  absl::StatusOr<int64_t> scale_bytes = CheckedMul(blocks, 4, "scale piece");
  if (sp.wire_dtype() != v1::FP32 || !scale_bytes.ok() ||
      !RangeWithin(sp.bucket_offset(), *scale_bytes, b.bytes(), "scale piece").ok()) {
    return absl::InvalidArgumentError(absl::StrCat("scale piece ", g.scale_piece, " is not ",
                                                   blocks, " fp32 values in the bucket"));
  }
  return g;
}

absl::Status CheckScalePiece(const v1::Bucket& b, int i) {
  const int q = b.pieces(i).scales_of() - 1;
  if (q < 0 || q >= b.pieces_size() || b.pieces(q).quant_block_size() == 0) {
    return absl::InvalidArgumentError("scales_of names no quantized piece of the bucket");
  }
  return QuantGrid(b, q).status();
}

absl::Status SetPartBox(const v1::Piece& p, QuantizeInput& in) {
  if (p.dst().shape_size() < 2 || p.dst().shape_size() > kMaxViewDims) {
    return absl::InvalidArgumentError("quantize input needs a destination view of 2..8 dims");
  }
  for (int d = 0; d < p.dst().shape_size(); ++d) in.shape[d] = p.dst().shape(d);
  return absl::OkStatus();
}

absl::Status CheckDirectWritable(const v1::Piece& p) {
  if (p.reduce_id() != 0 || p.quantize_id() != 0 || p.relay() || p.scales_of() != 0 ||
      p.quant_block_size() != 0) {
    return absl::InvalidArgumentError(
        "cannot be written directly (a reduce or quantize input, a relay or a block-fp8 piece "
        "needs the receiver's own op)");
  }
  return absl::OkStatus();
}

}  // namespace wsync::exec::bind_internal
