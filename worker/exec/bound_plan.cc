#include "worker/exec/bound_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cast.h"
#include "common/plan_names.h"
#include "common/status_macros.h"

namespace wsync::exec {
namespace {

constexpr int64_t kStagingAlign = 64;

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

std::string ShapeString(const v1::TensorView& v) {
  return absl::StrCat("[", absl::StrJoin(v.shape(), ","), "]");
}

class Binder {
 public:
  Binder(const v1::Plan& plan, int32_t worker, const BufferRegistry& registry, MemorySpace space,
         const DirectWrites* direct)
      : plan_(plan), worker_(worker), registry_(registry), space_(space), direct_(direct) {}

  absl::StatusOr<std::shared_ptr<const BoundPlan>> Bind();

 private:
  struct Partial {
    ReduceInput input;
    std::string where;
    bool consumed = false;
  };

  // Which side's buffer a view names: the view says (a colocated worker has
  // both sides, possibly with the same names; a relay reads a destination
  // buffer), never the op's role.
  static BufferSide SideOf(const v1::TensorView& v) {
    return v.side() == v1::DESTINATION_BUFFER ? BufferSide::kDestination : BufferSide::kSource;
  }

  // role: kDestination for views written (piece / reduce dst), kSource for
  // views read.
  // `peer`: resolve in that peer's buffers (direct writes) instead of ours.
  absl::StatusOr<StridedView> Resolve(const v1::TensorView& v, BufferSide role,
                                      const char* which,
                                      const BufferRegistry* peer = nullptr) const;
  bool WritesTo(int32_t peer) const {
    return direct_ != nullptr &&
           std::binary_search(direct_->write_to.begin(), direct_->write_to.end(), peer);
  }
  bool WrittenBy(int32_t peer) const {
    return direct_ != nullptr &&
           std::binary_search(direct_->written_by.begin(), direct_->written_by.end(), peer);
  }
  absl::Status BindPut(const v1::Bucket& b, int32_t round, BoundPlan& out);
  std::string Where(int32_t round, const char* op, const v1::Bucket& b) const {
    return absl::StrCat("worker ", worker_, " round ", round, ": ", op, " bucket ", b.id(),
                        " (worker ", b.sender(), " -> ", b.receiver(), ")");
  }
  std::string PieceWhere(const std::string& bucket_where, int i, const v1::Piece& p) const {
    return absl::StrCat(bucket_where, " piece ", i, " (tensor '",
                        PlanNameOrIndex(plan_, p.tensor_name()), "')");
  }

  absl::Status BindRound(const v1::Round& round, BoundRound& out);
  absl::Status BindSend(const v1::Bucket& b, BoundTransfer& t, BoundRound& out);
  absl::Status BindRecv(const v1::Bucket& b, BoundTransfer& t, BoundRound& out,
                        std::map<std::pair<int64_t, int32_t>, Partial>& partials);
  absl::Status BindCopy(const v1::Bucket& b, int32_t round, BoundRound& out,
                        std::map<std::pair<int64_t, int32_t>, Partial>& partials);
  absl::Status BindReduce(const v1::Reduce& r, int32_t round, BoundRound& out,
                          std::map<std::pair<int64_t, int32_t>, Partial>& partials);
  struct QuantPart {
    QuantizeInput input;
    std::string where;
    bool consumed = false;
  };
  absl::Status BindQuantize(const v1::Quantize& q, int32_t round, BoundRound& out);
  std::map<std::pair<int64_t, int32_t>, QuantPart> qparts_;  // this round's inputs
  std::unordered_map<int64_t, const v1::Quantize*> quantizes_;
  std::set<int64_t> seen_quantizes_;

  const v1::Plan& plan_;
  const int32_t worker_;
  const BufferRegistry& registry_;
  const MemorySpace space_;
  const DirectWrites* const direct_;
  BoundPlan* bound_ = nullptr;  // the plan being bound (puts go there)
  std::unordered_map<int64_t, const v1::Bucket*> buckets_;
  std::unordered_map<int64_t, const v1::Reduce*> reduces_;
  std::set<int64_t> seen_buckets_;
  std::set<int64_t> seen_reduces_;
};

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
  int64_t last = 0;
  bool empty = false;
  for (int d = 0; d < v.shape_size(); ++d) {
    const int64_t n = v.shape(d), s = v.strides(d);
    if (n < 0 || s < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": negative size or stride"));
    }
    if (n == 0) empty = true;
    int64_t step;
    if (n > 0 &&
        (__builtin_mul_overflow(n - 1, s, &step) || __builtin_add_overflow(last, step, &last))) {
      return absl::OutOfRangeError(absl::StrCat(what, ": extent overflows"));
    }
  }
  int64_t end = v.byte_offset();
  if (!empty) {
    int64_t span;
    if (__builtin_mul_overflow(last + 1, esize, &span) || __builtin_add_overflow(end, span, &end)) {
      return absl::OutOfRangeError(absl::StrCat(what, ": extent overflows"));
    }
  }
  if (end > buf->bytes) {
    return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", v.byte_offset(), ", ", end,
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
  if (p.bucket_offset() < 0 || p.bucket_offset() + numel * wsize > b.bytes()) {
    return absl::OutOfRangeError(absl::StrCat("packed bytes [", p.bucket_offset(), ", ",
                                              p.bucket_offset() + numel * wsize,
                                              ") lie outside the bucket's ", b.bytes(), " bytes"));
  }
  return absl::OkStatus();
}

// A piece that its receiver does not write into dst directly (a reduce or
// quantize input): its packed bytes in the round's staging, as a flat view.
absl::Status StagedInput(const v1::Bucket& b, const v1::Piece& p, int64_t transfer_offset,
                         const char* kind, StridedView* view, int64_t* staging_offset) {
  if (b.zero_copy()) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " in a zero-copy bucket"));
  }
  int64_t numel = 1;
  for (int64_t n : p.dst().shape()) numel *= n;
  RETURN_IF_ERROR(CheckPacked(b, p, numel));
  *staging_offset = transfer_offset + p.bucket_offset();
  view->dtype = p.wire_dtype();
  view->ndim = 1;
  view->shape[0] = numel;
  view->strides[0] = 1;
  return absl::OkStatus();
}

absl::Status CheckSameCount(const v1::Piece& p) {
  int64_t a = 1, b = 1;
  for (int64_t n : p.src().shape()) a *= n;
  for (int64_t n : p.dst().shape()) b *= n;
  if (a != b) {
    return absl::InvalidArgumentError(absl::StrCat("source shape ", ShapeString(p.src()),
                                                   " and destination shape ", ShapeString(p.dst()),
                                                   " hold different element counts"));
  }
  return absl::OkStatus();
}

// A row block of a row-major tensor arrives as an N-d view; it is contiguous
// once its dims are merged, so coalesce before judging.
absl::Status CheckZeroCopy(const v1::Bucket& b, StridedView v) {
  StridedView* one[] = {&v};
  CoalesceViews(one);
  if (b.pieces_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("zero-copy bucket has ", b.pieces_size(), " pieces, needs exactly 1"));
  }
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

struct QuantGridInfo {
  int64_t outer = 1, rows = 0, cols = 0, block_rows = 0, block_cols = 0;
  int scale_piece = -1;
};

// Piece i of b is sender-quantized: its grid (from its dst shape) and the
// piece carrying its scales.
absl::StatusOr<QuantGridInfo> QuantGrid(const v1::Bucket& b, int i) {
  const v1::Piece& p = b.pieces(i);
  QuantGridInfo g;
  const int nd = p.dst().shape_size();
  if (p.quant_block_size() != 2 || nd < 2 || p.quant_block(0) <= 0 || p.quant_block(1) <= 0 ||
      p.wire_dtype() != v1::FP8_E4M3) {
    return absl::InvalidArgumentError(
        "quantized piece needs 2 positive blocks, a destination of >= 2 dims and wire FP8_E4M3");
  }
  for (int d = 0; d + 2 < nd; ++d) g.outer *= p.dst().shape(d);
  g.rows = p.dst().shape(nd - 2);
  g.cols = p.dst().shape(nd - 1);
  g.block_rows = p.quant_block(0);
  g.block_cols = p.quant_block(1);
  for (int k = 0; k < b.pieces_size(); ++k) {
    if (b.pieces(k).scales_of() == i + 1) {
      if (g.scale_piece >= 0) return absl::InvalidArgumentError("two scale pieces");
      g.scale_piece = k;
    }
  }
  if (g.scale_piece < 0) return absl::InvalidArgumentError("no scale piece");
  const v1::Piece& sp = b.pieces(g.scale_piece);
  const int64_t blocks = g.outer * ((g.rows + g.block_rows - 1) / g.block_rows) *
                         ((g.cols + g.block_cols - 1) / g.block_cols);
  if (sp.wire_dtype() != v1::FP32 || sp.bucket_offset() < 0 ||
      sp.bucket_offset() + 4 * blocks > b.bytes()) {
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

// The input's box inside its quantization region: shape from the piece's
// dst view (the region's dims); the offset comes from the Quantize.
absl::Status SetPartBox(const v1::Piece& p, QuantizeInput& in) {
  if (p.dst().shape_size() < 2 || p.dst().shape_size() > kMaxViewDims) {
    return absl::InvalidArgumentError("quantize input needs a destination view of 2..8 dims");
  }
  for (int d = 0; d < p.dst().shape_size(); ++d) in.shape[d] = p.dst().shape(d);
  return absl::OkStatus();
}

absl::Status Binder::BindSend(const v1::Bucket& b, BoundTransfer& t, BoundRound& out) {
  const std::string where = Where(out.index, "SEND", b);
  for (int i = 0; i < b.pieces_size(); ++i) {
    const v1::Piece& p = b.pieces(i);
    const std::string pw = PieceWhere(where, i, p);
    if (p.scales_of() != 0) {
      // Written by the pack of its quantized piece.
      RETURN_IF_ERROR(Annotate(CheckScalePiece(b, i), pw));
      continue;
    }
    RETURN_IF_ERROR(Annotate(CheckSameCount(p), pw));
    auto src = Resolve(p.src(), BufferSide::kSource, "src");
    if (!src.ok()) return Annotate(src.status(), pw);
    if (p.quant_block_size() != 0) {
      if (b.zero_copy()) {
        return absl::InvalidArgumentError(
            absl::StrCat(pw, ": quantized piece in a zero-copy bucket"));
      }
      RETURN_IF_ERROR(Annotate(CheckPacked(b, p, src->num_elements()), pw));
      PackItem item{*src, t.staging_offset + p.bucket_offset(), p.wire_dtype()};
      auto grid = QuantGrid(b, i);
      if (!grid.ok()) return Annotate(grid.status(), pw);
      item.quant_outer = grid->outer;
      item.quant_rows = grid->rows;
      item.quant_cols = grid->cols;
      item.quant_block_rows = grid->block_rows;
      item.quant_block_cols = grid->block_cols;
      item.scale_offset = t.staging_offset + b.pieces(grid->scale_piece).bucket_offset();
      StridedView* one[] = {&item.src};
      CoalesceViews(one);
      out.pack.push_back(item);
      continue;
    }
    if (b.zero_copy()) {
      RETURN_IF_ERROR(Annotate(CheckZeroCopy(b, *src), pw));
      t.direct = src->data;
      continue;
    }
    RETURN_IF_ERROR(Annotate(CheckPacked(b, p, src->num_elements()), pw));
    if (!CanConvert(src->dtype, p.wire_dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(pw, ": no conversion from ",
                                                     DTypeName(src->dtype), " to wire dtype ",
                                                     DTypeName(p.wire_dtype())));
    }
    StridedView* one[] = {&*src};
    CoalesceViews(one);
    out.pack.push_back(PackItem{*src, t.staging_offset + p.bucket_offset(), p.wire_dtype()});
  }
  return absl::OkStatus();
}

// The receiver runs no op for directly written bytes: only a plain delivery
// into its destination can skip it.
absl::Status CheckDirectWritable(const v1::Piece& p) {
  if (p.reduce_id() != 0 || p.quantize_id() != 0 || p.relay() || p.scales_of() != 0 ||
      p.quant_block_size() != 0) {
    return absl::InvalidArgumentError(
        "cannot be written directly (a reduce or quantize input, a relay or a block-fp8 piece "
        "needs the receiver's own op)");
  }
  return absl::OkStatus();
}

absl::Status Binder::BindPut(const v1::Bucket& b, int32_t round, BoundPlan& out) {
  const std::string where = Where(round, "SEND (direct write)", b);
  auto peer = direct_->peer_buffers.find(b.receiver());
  if (peer == direct_->peer_buffers.end() || peer->second == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the buffers of worker ", b.receiver(), " are not mapped here"));
  }
  for (int i = 0; i < b.pieces_size(); ++i) {
    const v1::Piece& p = b.pieces(i);
    const std::string pw = PieceWhere(where, i, p);
    RETURN_IF_ERROR(Annotate(CheckDirectWritable(p), pw));
    auto src = Resolve(p.src(), BufferSide::kSource, "src");
    if (!src.ok()) return Annotate(src.status(), pw);
    auto dst = Resolve(p.dst(), BufferSide::kDestination, "dst", peer->second);
    if (!dst.ok()) return Annotate(dst.status(), pw);
    if (!SameShape(*src, *dst)) {
      return absl::InvalidArgumentError(absl::StrCat(pw, ": source shape ", ShapeString(p.src()),
                                                     " differs from destination shape ",
                                                     ShapeString(p.dst())));
    }
    if (!CanConvert(src->dtype, dst->dtype) ||
        (p.wire_dtype() != src->dtype && p.wire_dtype() != dst->dtype)) {
      return absl::UnimplementedError(absl::StrCat(
          pw, ": direct write ", DTypeName(src->dtype), " -> ", DTypeName(p.wire_dtype()), " -> ",
          DTypeName(dst->dtype), " needs one conversion (the wire dtype must be one of the two)"));
    }
    StridedView* both[] = {&*src, &*dst};
    CoalesceViews(both);
    out.puts.push_back(CopyItem{*src, *dst});
  }
  out.bytes_put += b.bytes();
  return absl::OkStatus();
}

absl::Status Binder::BindRecv(const v1::Bucket& b, BoundTransfer& t, BoundRound& out,
                              std::map<std::pair<int64_t, int32_t>, Partial>& partials) {
  const std::string where = Where(out.index, "RECV", b);
  for (int i = 0; i < b.pieces_size(); ++i) {
    const v1::Piece& p = b.pieces(i);
    const std::string pw = PieceWhere(where, i, p);
    if (p.scales_of() != 0) {
      RETURN_IF_ERROR(Annotate(CheckScalePiece(b, i), pw));
    } else {
      RETURN_IF_ERROR(Annotate(CheckSameCount(p), pw));
    }
    if (p.quantize_id() != 0) {
      QuantPart part;
      RETURN_IF_ERROR(Annotate(StagedInput(b, p, t.staging_offset, "quantize input",
                                           &part.input.view, &part.input.staging_offset),
                               pw));
      RETURN_IF_ERROR(Annotate(SetPartBox(p, part.input), pw));
      part.where = pw;
      qparts_[{b.id(), i}] = part;
      continue;
    }
    if (p.reduce_id() != 0) {
      Partial part;
      RETURN_IF_ERROR(Annotate(StagedInput(b, p, t.staging_offset, "partial piece",
                                           &part.input.view, &part.input.staging_offset),
                               pw));
      part.where = pw;
      partials[{b.id(), i}] = part;
      continue;
    }
    auto dst = Resolve(p.dst(), BufferSide::kDestination, "dst");
    if (!dst.ok()) return Annotate(dst.status(), pw);
    if (b.zero_copy()) {
      RETURN_IF_ERROR(Annotate(CheckZeroCopy(b, *dst), pw));
      t.direct = dst->data;
      continue;
    }
    RETURN_IF_ERROR(Annotate(CheckPacked(b, p, dst->num_elements()), pw));
    if (!CanConvert(p.wire_dtype(), dst->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(pw, ": no conversion from wire dtype ",
                                                     DTypeName(p.wire_dtype()), " to ",
                                                     DTypeName(dst->dtype)));
    }
    StridedView* one[] = {&*dst};
    CoalesceViews(one);
    out.unpack.push_back(UnpackItem{t.staging_offset + p.bucket_offset(), p.wire_dtype(), *dst});
  }
  return absl::OkStatus();
}

absl::Status Binder::BindCopy(const v1::Bucket& b, int32_t round, BoundRound& out,
                              std::map<std::pair<int64_t, int32_t>, Partial>& partials) {
  const std::string where = Where(round, "COPY", b);
  for (int i = 0; i < b.pieces_size(); ++i) {
    const v1::Piece& p = b.pieces(i);
    const std::string pw = PieceWhere(where, i, p);
    if (p.scales_of() != 0) {
      // Written by the local quantization of its quantized piece.
      RETURN_IF_ERROR(Annotate(CheckScalePiece(b, i), pw));
      continue;
    }
    auto src = Resolve(p.src(), BufferSide::kSource, "src");
    if (!src.ok()) return Annotate(src.status(), pw);
    if (p.quantize_id() != 0) {
      QuantPart part;
      part.input.view = *src;
      RETURN_IF_ERROR(Annotate(CheckSameCount(p), pw));
      RETURN_IF_ERROR(Annotate(SetPartBox(p, part.input), pw));
      part.where = pw;
      qparts_[{b.id(), i}] = part;
      continue;
    }
    if (p.quant_block_size() != 0) {
      // A local delivery of whole blocks: quantize src straight into dst.
      RETURN_IF_ERROR(Annotate(CheckSameCount(p), pw));
      auto grid = QuantGrid(b, i);
      if (!grid.ok()) return Annotate(grid.status(), pw);
      auto dst = Resolve(p.dst(), BufferSide::kDestination, "dst");
      if (!dst.ok()) return Annotate(dst.status(), pw);
      auto sdst = Resolve(b.pieces(grid->scale_piece).dst(), BufferSide::kDestination, "scale dst");
      if (!sdst.ok()) return Annotate(sdst.status(), pw);
      QuantizeItem item;
      item.dst = *dst;
      item.scale_dst = *sdst;
      item.block_rows = grid->block_rows;
      item.block_cols = grid->block_cols;
      item.input_begin = static_cast<int32_t>(out.quantize_inputs.size());
      item.num_inputs = 1;
      QuantizeInput in;
      in.view = *src;
      for (int d = 0; d < dst->ndim; ++d) in.shape[d] = dst->shape[d];
      out.quantize_inputs.push_back(in);
      out.quantizes.push_back(item);
      out.quantize_ids.push_back(-b.id() - 1);
      continue;
    }
    if (p.reduce_id() != 0) {
      // A local partial is read straight from the source by the reduce; its
      // value must not pass through a narrower wire dtype first.
      if (src->dtype != p.wire_dtype()) {
        return absl::UnimplementedError(
            absl::StrCat(pw, ": local partial with a cast (", DTypeName(src->dtype), " -> ",
                         DTypeName(p.wire_dtype()), ") before the reduce is not supported"));
      }
      Partial part;
      part.input.view = *src;
      part.where = pw;
      partials[{b.id(), i}] = part;
      continue;
    }
    auto dst = Resolve(p.dst(), BufferSide::kDestination, "dst");
    if (!dst.ok()) return Annotate(dst.status(), pw);
    if (!SameShape(*src, *dst)) {
      return absl::InvalidArgumentError(absl::StrCat(pw, ": source shape ", ShapeString(p.src()),
                                                     " differs from destination shape ",
                                                     ShapeString(p.dst())));
    }
    if (!CanConvert(src->dtype, dst->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          pw, ": no conversion from ", DTypeName(src->dtype), " to ", DTypeName(dst->dtype)));
    }
    // The plan's semantics are src -> wire -> dst; one direct conversion is
    // the same only when the wire dtype is one of the two.
    if (p.wire_dtype() != src->dtype && p.wire_dtype() != dst->dtype) {
      return absl::UnimplementedError(absl::StrCat(
          pw, ": local copy through a third dtype (", DTypeName(src->dtype), " -> ",
          DTypeName(p.wire_dtype()), " -> ", DTypeName(dst->dtype), ") is not supported"));
    }
    StridedView* both[] = {&*src, &*dst};
    CoalesceViews(both);
    out.copies.push_back(CopyItem{*src, *dst});
  }
  out.copy_buckets.push_back(b.id());
  out.bytes_local += b.bytes();
  return absl::OkStatus();
}

absl::Status Binder::BindReduce(const v1::Reduce& r, int32_t round, BoundRound& out,
                                std::map<std::pair<int64_t, int32_t>, Partial>& partials) {
  const std::string where = absl::StrCat("worker ", worker_, " round ", round, ": REDUCE ", r.id());
  if (r.worker() != worker_ || r.round() != round) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the reduce belongs to worker ", r.worker(), " round ", r.round()));
  }
  if (r.inputs_size() == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": no inputs"));
  auto dst = Resolve(r.dst(), BufferSide::kDestination, "dst");
  if (!dst.ok()) return Annotate(dst.status(), where);
  const DType acc = r.accumulate_dtype();
  if (!CanConvert(acc, dst->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no conversion from accumulate dtype ",
                                                   DTypeName(acc), " to ", DTypeName(dst->dtype)));
  }
  ReduceItem item;
  item.op = r.op();
  item.accumulate_dtype = acc;
  item.input_begin = static_cast<int32_t>(out.reduce_inputs.size());
  item.num_inputs = r.inputs_size();
  std::vector<ReduceInput> inputs;
  for (int k = 0; k < r.inputs_size(); ++k) {
    const v1::ReduceInput& in = r.inputs(k);
    auto it = partials.find({in.bucket(), in.piece()});
    if (it == partials.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", k, " (bucket ", in.bucket(), " piece ", in.piece(),
                       ") is not a partial piece this worker receives or copies in round ", round));
    }
    const v1::Bucket& b = *buckets_.at(in.bucket());
    if (b.pieces(in.piece()).reduce_id() != r.id()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": input ", k, " is ", it->second.where,
                                                     ", which belongs to reduce ",
                                                     b.pieces(in.piece()).reduce_id()));
    }
    if (it->second.consumed) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", k, " (", it->second.where, ") is used twice"));
    }
    it->second.consumed = true;
    const ReduceInput& ri = it->second.input;
    if (ri.view.num_elements() != dst->num_elements()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", k, " has ", ri.view.num_elements(),
                       " elements, the destination ", dst->num_elements()));
    }
    if (ri.staging_offset < 0 && !SameShape(ri.view, *dst)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": input ", k, " (", it->second.where,
                                                     ") has another shape than the destination"));
    }
    if (!CanConvert(ri.view.dtype, acc)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": input ", k, " dtype ",
                                                     DTypeName(ri.view.dtype),
                                                     " cannot be accumulated in ", DTypeName(acc)));
    }
    inputs.push_back(ri);
  }
  // Strided inputs and the destination share a shape: coalesce them together.
  std::vector<StridedView*> joint = {&*dst};
  for (ReduceInput& in : inputs) {
    if (in.staging_offset < 0) joint.push_back(&in.view);
  }
  CoalesceViews(joint);
  item.dst = *dst;
  for (ReduceInput& in : inputs) out.reduce_inputs.push_back(in);
  out.reduces.push_back(item);
  out.reduce_ids.push_back(r.id());
  return absl::OkStatus();
}

absl::Status Binder::BindQuantize(const v1::Quantize& q, int32_t round, BoundRound& out) {
  const std::string where =
      absl::StrCat("worker ", worker_, " round ", round, ": QUANTIZE ", q.id());
  if (q.worker() != worker_ || q.round() != round) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the quantize belongs to worker ", q.worker(), " round ", q.round()));
  }
  auto dst = Resolve(q.dst(), BufferSide::kDestination, "dst");
  if (!dst.ok()) return Annotate(dst.status(), where);
  auto sdst = Resolve(q.scale_dst(), BufferSide::kDestination, "scale dst");
  if (!sdst.ok()) return Annotate(sdst.status(), where);
  if (q.block_size() != 2 || q.block(0) <= 0 || q.block(1) <= 0 || dst->ndim < 2 ||
      dst->dtype != v1::FP8_E4M3 || sdst->dtype != v1::FP32) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": needs 2 positive blocks, an FP8_E4M3 destination of >= 2 dims, FP32 scales"));
  }
  QuantizeItem item;
  item.dst = *dst;
  item.scale_dst = *sdst;
  item.block_rows = q.block(0);
  item.block_cols = q.block(1);
  item.input_begin = static_cast<int32_t>(out.quantize_inputs.size());
  item.num_inputs = q.inputs_size();
  int64_t covered = 0;
  for (int k = 0; k < q.inputs_size(); ++k) {
    const v1::QuantizeInput& in = q.inputs(k);
    auto it = qparts_.find({in.bucket(), in.piece()});
    if (it == qparts_.end() ||
        buckets_.at(in.bucket())->pieces(in.piece()).quantize_id() != q.id()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", k, " (bucket ", in.bucket(), " piece ", in.piece(),
                       ") is not a part of it this worker receives or copies in round ", round));
    }
    if (it->second.consumed) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", k, " (", it->second.where, ") is used twice"));
    }
    it->second.consumed = true;
    QuantizeInput qi = it->second.input;
    if (in.offset_size() != dst->ndim) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": input ", k, " offset has ", in.offset_size(), " dims, the region ", dst->ndim));
    }
    int64_t m = 1;
    for (int d = 0; d < dst->ndim; ++d) {
      qi.offset[d] = in.offset(d);
      if (qi.offset[d] < 0 || qi.offset[d] + qi.shape[d] > dst->shape[d]) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": input ", k, " (", it->second.where,
                                                       ") lies outside the region"));
      }
      m *= qi.shape[d];
    }
    covered += m;
    out.quantize_inputs.push_back(qi);
  }
  if (covered != dst->num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": inputs hold ", covered,
                                                   " elements, the region ", dst->num_elements()));
  }
  out.quantizes.push_back(item);
  out.quantize_ids.push_back(q.id());
  return absl::OkStatus();
}

absl::Status Binder::BindRound(const v1::Round& round, BoundRound& out) {
  out.index = round.index();
  out.plan_staging_bytes = round.staging_bytes();
  std::vector<std::pair<BoundTransfer, const v1::Bucket*>> sends, recvs;
  std::vector<const v1::Bucket*> copies;
  std::vector<const v1::Reduce*> reduces;
  std::vector<const v1::Quantize*> quants;
  qparts_.clear();
  for (int o = 0; o < round.ops_size(); ++o) {
    const v1::Op& op = round.ops(o);
    const std::string where = absl::StrCat("worker ", worker_, " round ", round.index(), " op ", o,
                                           " (", v1::Op::Kind_Name(op.kind()), ")");
    if (op.kind() == v1::Op::REDUCE) {
      auto it = reduces_.find(op.reduce());
      if (it == reduces_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unknown reduce ", op.reduce()));
      }
      if (!seen_reduces_.insert(op.reduce()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": reduce ", op.reduce(), " runs twice"));
      }
      reduces.push_back(it->second);
      continue;
    }
    if (op.kind() == v1::Op::QUANTIZE) {
      auto it = quantizes_.find(op.quantize());
      if (it == quantizes_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown quantize ", op.quantize()));
      }
      if (!seen_quantizes_.insert(op.quantize()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": quantize ", op.quantize(), " runs twice"));
      }
      quants.push_back(it->second);
      continue;
    }
    auto it = buckets_.find(op.bucket());
    if (it == buckets_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown bucket ", op.bucket()));
    }
    const v1::Bucket& b = *it->second;
    if (!seen_buckets_.insert(b.id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bucket ", b.id(), " runs twice"));
    }
    if (b.round() != round.index()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": bucket ", b.id(), " belongs to round ", b.round()));
    }
    const bool local = b.transport() == v1::TRANSPORT_LOCAL;
    bool ok = false;
    switch (op.kind()) {
      case v1::Op::SEND:
        ok = !local && b.sender() == worker_ && b.receiver() == op.peer() && op.peer() != worker_;
        break;
      case v1::Op::RECV:
        ok = !local && b.receiver() == worker_ && b.sender() == op.peer() && op.peer() != worker_;
        break;
      case v1::Op::COPY:
        ok = local && b.sender() == worker_ && b.receiver() == worker_;
        break;
      default:
        break;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": bucket ", b.id(), " (worker ", b.sender(), " -> ", b.receiver(), ", ",
          local ? "local" : "network", ") does not match this op (peer ", op.peer(), ")"));
    }
    BoundTransfer t;
    t.bucket = b.id();
    t.peer = op.peer();
    t.seq = b.seq();
    t.bytes = b.bytes();
    t.zero_copy = b.zero_copy();
    if (t.bytes < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative size"));
    if (op.kind() == v1::Op::SEND && WritesTo(t.peer)) {
      RETURN_IF_ERROR(BindPut(b, round.index(), *bound_));
      continue;
    }
    if (op.kind() == v1::Op::RECV && WrittenBy(t.peer)) {
      for (int i = 0; i < b.pieces_size(); ++i) {
        RETURN_IF_ERROR(Annotate(CheckDirectWritable(b.pieces(i)),
                                 PieceWhere(Where(round.index(), "RECV (direct write)", b), i,
                                            b.pieces(i))));
      }
      bound_->bytes_put_into += t.bytes;  // the sender writes it; nothing to run here
      continue;
    }
    if (op.kind() == v1::Op::SEND) sends.push_back({t, &b});
    if (op.kind() == v1::Op::RECV) recvs.push_back({t, &b});
    if (op.kind() == v1::Op::COPY) copies.push_back(&b);
  }
  auto by_peer_seq = [](const auto& a, const auto& b) {
    return std::make_pair(a.first.peer, a.first.seq) < std::make_pair(b.first.peer, b.first.seq);
  };
  std::stable_sort(sends.begin(), sends.end(), by_peer_seq);
  std::stable_sort(recvs.begin(), recvs.end(), by_peer_seq);

  // Staging: sends, then receives, back to back; aligned when that still
  // fits the plan's grant.
  for (int64_t align : {kStagingAlign, int64_t{1}}) {
    int64_t offset = 0;
    for (auto* list : {&sends, &recvs}) {
      for (auto& [t, b] : *list) {
        if (t.zero_copy) continue;
        offset = (offset + align - 1) / align * align;
        t.staging_offset = offset;
        offset += t.bytes;
      }
    }
    out.staging_bytes = offset;
    if (offset <= out.plan_staging_bytes) break;
  }
  if (out.staging_bytes > out.plan_staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_, " round ", out.index, ": staged buckets need ",
                     out.staging_bytes, " bytes but the plan grants ", out.plan_staging_bytes));
  }
  std::map<std::pair<int64_t, int32_t>, Partial> partials;
  for (auto& [t, b] : sends) {
    RETURN_IF_ERROR(BindSend(*b, t, out));
    out.bytes_sent += t.bytes;
    out.sends.push_back(t);
  }
  for (auto& [t, b] : recvs) {
    RETURN_IF_ERROR(BindRecv(*b, t, out, partials));
    out.bytes_received += t.bytes;
    out.recvs.push_back(t);
  }
  for (const v1::Bucket* b : copies) RETURN_IF_ERROR(BindCopy(*b, out.index, out, partials));
  for (const v1::Reduce* r : reduces) RETURN_IF_ERROR(BindReduce(*r, out.index, out, partials));
  for (const v1::Quantize* q : quants) RETURN_IF_ERROR(BindQuantize(*q, out.index, out));
  for (const auto& [key, part] : qparts_) {
    if (!part.consumed) {
      return absl::InvalidArgumentError(
          absl::StrCat(part.where, ": quantize input consumed by no quantize of this round"));
    }
  }
  for (const auto& [key, part] : partials) {
    if (!part.consumed) {
      return absl::InvalidArgumentError(
          absl::StrCat(part.where, ": partial piece consumed by no reduce of this round"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const BoundPlan>> Binder::Bind() {
  for (const v1::Bucket& b : plan_.buckets()) {
    if (!buckets_.emplace(b.id(), &b).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan lists bucket ", b.id(), " twice"));
    }
  }
  for (const v1::Reduce& r : plan_.reduces()) {
    if (!reduces_.emplace(r.id(), &r).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan lists reduce ", r.id(), " twice"));
    }
  }
  for (const v1::Quantize& q : plan_.quantizes()) {
    if (!quantizes_.emplace(q.id(), &q).second) {
      return absl::InvalidArgumentError(absl::StrCat("plan lists quantize ", q.id(), " twice"));
    }
  }
  auto bound = std::make_shared<BoundPlan>();
  bound_ = bound.get();
  if (direct_ != nullptr) {
    for (const auto* list : {&direct_->write_to, &direct_->written_by}) {
      if (!std::is_sorted(list->begin(), list->end()) ||
          std::adjacent_find(list->begin(), list->end()) != list->end() ||
          std::binary_search(list->begin(), list->end(), worker_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "worker ", worker_, ": direct-write peers must be sorted, distinct and not the worker "
            "itself, got [", absl::StrJoin(*list, ","), "]"));
      }
    }
    bound->direct_write_to = direct_->write_to;
    bound->direct_written_by = direct_->written_by;
    bound->ready_token = direct_->ready_token;
    bound->expected_ready_tokens = direct_->expected_ready_tokens;
  }
  bound->key = plan_.key();
  bound->worker = worker_;
  bound->registry_generation = registry_.generation();
  bound->space = space_;
  const v1::RankPlan* rank = nullptr;
  for (const v1::RankPlan& rp : plan_.ranks()) {
    if (rp.worker() != worker_) continue;
    if (rank != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan has two rank plans for worker ", worker_));
    }
    rank = &rp;
  }
  if (rank != nullptr) {
    int32_t prev = -1;
    for (const v1::Round& round : rank->rounds()) {
      if (round.index() <= prev) {
        return absl::InvalidArgumentError(
            absl::StrCat("worker ", worker_, ": round ", round.index(), " follows round ", prev));
      }
      prev = round.index();
      BoundRound br;
      RETURN_IF_ERROR(BindRound(round, br));
      bound->max_staging_bytes = std::max(bound->max_staging_bytes, br.staging_bytes);
      bound->total_bytes += br.bytes_sent + br.bytes_received + br.bytes_local;
      bound->rounds.push_back(std::move(br));
    }
  }
  bound->total_bytes += bound->bytes_put + bound->bytes_put_into;
  // Every bucket and reduce of this worker must be run by its op list: a side
  // that silently skips one corrupts data on the other.
  for (const v1::Bucket& b : plan_.buckets()) {
    if ((b.sender() == worker_ || b.receiver() == worker_) && !seen_buckets_.count(b.id())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", b.id(), " (worker ", b.sender(), " -> ", b.receiver(), ", round ", b.round(),
          ") involves worker ", worker_, " but no op of its rank plan runs it"));
    }
  }
  for (const v1::Quantize& q : plan_.quantizes()) {
    if (q.worker() == worker_ && !seen_quantizes_.count(q.id())) {
      return absl::InvalidArgumentError(absl::StrCat("quantize ", q.id(), " of worker ", worker_,
                                                     " is run by no op of its rank plan"));
    }
  }
  for (const v1::Reduce& r : plan_.reduces()) {
    if (r.worker() == worker_ && !seen_reduces_.count(r.id())) {
      return absl::InvalidArgumentError(absl::StrCat("reduce ", r.id(), " of worker ", worker_,
                                                     " is run by no op of its rank plan"));
    }
  }
  return std::shared_ptr<const BoundPlan>(std::move(bound));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const BoundPlan>> BindPlan(const v1::Plan& plan, int32_t worker,
                                                          const BufferRegistry& registry,
                                                          MemorySpace space,
                                                          const DirectWrites* direct) {
  Binder binder(plan, worker, registry, space, direct);
  return binder.Bind();
}

}  // namespace wsync::exec
