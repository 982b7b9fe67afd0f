// Binding of the work a worker does on its own: local (COPY) buckets, and
// the reduces and quantizes that consume this round's partial pieces.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cast.h"
#include "common/checked_math.h"
#include "common/plan_pieces.h"
#include "common/status_macros.h"
#include "worker/exec/bound_plan_internal.h"

namespace wsync::exec::bind_internal {

absl::Status Binder::BindCopy(const v1::Bucket& b, int32_t round, BoundRound& out,
                              std::map<std::pair<int64_t, int32_t>, Partial>& partials) {
  const std::string where = Where(round, "COPY", b);
  const size_t copies_before = out.copies.size();
  bool transformed = false;  // a piece quantized or reduced (verify_pass.h)
  RETURN_IF_ERROR(ForEachPiece(b, [&](int64_t index, const v1::Piece& p) -> absl::Status {
    const int i = static_cast<int>(index);
    const std::string pw = PieceWhere(where, i, p);
    if (p.scales_of() != 0) {
      // Written by the local quantization of its quantized piece.
      RETURN_IF_ERROR(Annotate(CheckScalePiece(b, i), pw));
      return absl::OkStatus();
    }
    auto src = Resolve(p.src(), BufferSide::kSource, "src");
    if (!src.ok()) return Annotate(src.status(), pw);
    if (p.quantize_id() != 0 || p.quant_block_size() != 0 || p.reduce_id() != 0) {
      transformed = true;
    }
    if (p.quantize_id() != 0) {
      QuantPart part;
      part.input.view = *src;
      RETURN_IF_ERROR(Annotate(CheckSameCount(p), pw));
      RETURN_IF_ERROR(Annotate(SetPartBox(p, part.input), pw));
      part.where = pw;
      qparts_[{b.id(), i}] = part;
      return absl::OkStatus();
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
      return absl::OkStatus();
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
      return absl::OkStatus();
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
    return absl::OkStatus();
  }));
  out.copy_buckets.push_back(b.id());
  out.copy_counts.push_back(static_cast<int32_t>(out.copies.size() - copies_before));
  out.copy_transformed.push_back(transformed);
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
      if (!RangeWithin(qi.offset[d], qi.shape[d], dst->shape[d], where).ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": input ", k, " (", it->second.where,
                                                       ") lies outside the region"));
      }
      m *= qi.shape[d];
    }
    ASSIGN_OR_RETURN(covered, CheckedAdd(covered, m, absl::StrCat(where, ": inputs")));
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

}  // namespace wsync::exec::bind_internal
