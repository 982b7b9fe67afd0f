// Binding of the network buckets: what a SEND packs, what a RECV unpacks or
// stages for a reduce / quantize, and the puts of direct writes.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cast.h"
#include "common/plan_pieces.h"
#include "common/status_macros.h"
#include "worker/exec/bound_plan_internal.h"
#include "worker/plane/wire_hash.h"

namespace wsync::exec::bind_internal {

absl::Status Binder::BindSend(const v1::Bucket& b, BoundTransfer& t, BoundRound& out) {
  const std::string where = Where(out.index, "SEND", b);
  if (b.zero_copy()) RETURN_IF_ERROR(Annotate(CheckZeroCopyShape(b), where));
  RETURN_IF_ERROR(ForEachPiece(b, [&](int64_t index, const v1::Piece& p) -> absl::Status {
    const int i = static_cast<int>(index);
    const std::string pw = PieceWhere(where, i, p);
    if (p.scales_of() != 0) {
      // Written by the pack of its quantized piece.
      RETURN_IF_ERROR(Annotate(CheckScalePiece(b, i), pw));
      return absl::OkStatus();
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
      return absl::OkStatus();
    }
    if (b.zero_copy()) {
      RETURN_IF_ERROR(Annotate(CheckZeroCopy(b, *src), pw));
      t.direct = src->data;
      return absl::OkStatus();
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
    return absl::OkStatus();
  }));
  return absl::OkStatus();
}

absl::Status Binder::BindPut(const v1::Bucket& b, int32_t round, BoundPlan& out) {
  const std::string where = Where(round, "SEND (direct write)", b);
  auto peer = direct_ != nullptr ? direct_->peer_buffers.find(b.receiver())
                                 : std::map<int32_t, const BufferRegistry*>::const_iterator();
  if (direct_ == nullptr || peer == direct_->peer_buffers.end() || peer->second == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the buffers of worker ", b.receiver(), " are not mapped here"));
  }
  DirectBucket hashed = NewDirectBucket(b, round, /*sent=*/true);
  hashed.first_put = static_cast<int32_t>(out.puts.size());
  RETURN_IF_ERROR(ForEachPiece(b, [&](int64_t index, const v1::Piece& p) -> absl::Status {
    const int i = static_cast<int>(index);
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
    // The checksum reads src -> dst -> wire: the put converts src -> dst.
    WireHashItem h{*src, dst->dtype == p.wire_dtype() ? v1::DTYPE_UNSPECIFIED : dst->dtype,
                   p.wire_dtype(), p.bucket_offset()};
    StridedView* one[] = {&h.view};
    CoalesceViews(one);
    hashed.items.push_back(h);
    StridedView* both[] = {&*src, &*dst};
    CoalesceViews(both);
    out.puts.push_back(CopyItem{*src, *dst});
    out.put_origins.push_back(pw);
    return absl::OkStatus();
  }));
  hashed.num_puts = static_cast<int32_t>(out.puts.size()) - hashed.first_put;
  RETURN_IF_ERROR(Annotate(AddDirectBucket(std::move(hashed), out), where));
  out.bytes_put += b.bytes();
  return absl::OkStatus();
}

DirectBucket Binder::NewDirectBucket(const v1::Bucket& b, int32_t round, bool sent) const {
  DirectBucket d;
  d.bucket = b.id();
  d.peer = sent ? b.receiver() : b.sender();
  d.round = round;
  d.seq = b.seq();
  d.bytes = b.bytes();
  d.sent = sent;
  d.put_phase = b.put_phase();
  return d;
}

absl::Status Binder::AddDirectBucket(DirectBucket d, BoundPlan& out) {
  std::stable_sort(d.items.begin(), d.items.end(),
                   [](const WireHashItem& x, const WireHashItem& y) {
                     return x.bucket_offset < y.bucket_offset;
                   });
  RETURN_IF_ERROR(CheckWireHashItems(d.items, d.bytes));
  out.direct_buckets.push_back(std::move(d));
  return absl::OkStatus();
}

absl::Status Binder::BindDirectRecv(const v1::Bucket& b, int32_t round, BoundPlan& out) {
  const std::string where = Where(round, "RECV (direct write)", b);
  DirectBucket hashed = NewDirectBucket(b, round, /*sent=*/false);
  RETURN_IF_ERROR(ForEachPiece(b, [&](int64_t index, const v1::Piece& p) -> absl::Status {
    const int i = static_cast<int>(index);
    const std::string pw = PieceWhere(where, i, p);
    RETURN_IF_ERROR(Annotate(CheckDirectWritable(p), pw));
    auto dst = Resolve(p.dst(), BufferSide::kDestination, "dst");
    if (!dst.ok()) return Annotate(dst.status(), pw);
    if (!CanConvert(dst->dtype, p.wire_dtype())) {
      return absl::UnimplementedError(absl::StrCat(pw, ": its checksum cannot read ",
                                                   DTypeName(dst->dtype), " back as wire dtype ",
                                                   DTypeName(p.wire_dtype())));
    }
    WireHashItem h{*dst, v1::DTYPE_UNSPECIFIED, p.wire_dtype(), p.bucket_offset()};
    StridedView* one[] = {&h.view};
    CoalesceViews(one);
    hashed.items.push_back(h);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(Annotate(AddDirectBucket(std::move(hashed), out), where));
  out.bytes_put_into += b.bytes();  // the sender writes it; nothing to run here
  return absl::OkStatus();
}

absl::Status Binder::BindRecv(const v1::Bucket& b, BoundTransfer& t, BoundRound& out,
                              std::map<std::pair<int64_t, int32_t>, Partial>& partials) {
  const std::string where = Where(out.index, "RECV", b);
  if (b.zero_copy()) RETURN_IF_ERROR(Annotate(CheckZeroCopyShape(b), where));
  RETURN_IF_ERROR(ForEachPiece(b, [&](int64_t index, const v1::Piece& p) -> absl::Status {
    const int i = static_cast<int>(index);
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
      return absl::OkStatus();
    }
    if (p.reduce_id() != 0) {
      Partial part;
      RETURN_IF_ERROR(Annotate(StagedInput(b, p, t.staging_offset, "partial piece",
                                           &part.input.view, &part.input.staging_offset),
                               pw));
      part.where = pw;
      partials[{b.id(), i}] = part;
      return absl::OkStatus();
    }
    auto dst = Resolve(p.dst(), BufferSide::kDestination, "dst");
    if (!dst.ok()) return Annotate(dst.status(), pw);
    if (b.zero_copy()) {
      RETURN_IF_ERROR(Annotate(CheckZeroCopy(b, *dst), pw));
      t.direct = dst->data;
      return absl::OkStatus();
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
    return absl::OkStatus();
  }));
  return absl::OkStatus();
}

absl::Status OrderPutsByPhase(BoundPlan& out) {
  std::vector<DirectBucket*> sent;
  for (DirectBucket& d : out.direct_buckets) {
    if (d.sent) sent.push_back(&d);
  }
  auto by_phase = [](const DirectBucket* x, const DirectBucket* y) {
    return x->put_phase < y->put_phase;
  };
  if (std::is_sorted(sent.begin(), sent.end(), by_phase)) return absl::OkStatus();
  std::stable_sort(sent.begin(), sent.end(), by_phase);
  const size_t n = out.puts.size();
  if (out.put_origins.size() != n) {
    return absl::InternalError(
        absl::StrCat(n, " puts but ", out.put_origins.size(), " put origins"));
  }
  // order[k]: the put that goes to index k. Checked to be a permutation
  // (every put in exactly one sent bucket) before anything moves.
  std::vector<size_t> order;
  order.reserve(n);
  std::vector<int32_t> first_puts;
  first_puts.reserve(sent.size());
  std::vector<bool> taken(n, false);
  for (const DirectBucket* d : sent) {
    const size_t first = static_cast<size_t>(d->first_put);
    const size_t end = first + static_cast<size_t>(d->num_puts);
    if (d->first_put < 0 || d->num_puts < 0 || end > n) {
      return absl::InternalError(absl::StrCat("bucket ", d->bucket, ": puts [", first, ", ", end,
                                              ") outside the ", n, " bound"));
    }
    first_puts.push_back(static_cast<int32_t>(order.size()));
    for (size_t i = first; i < end; ++i) {
      if (taken[i]) {
        return absl::InternalError(
            absl::StrCat("bucket ", d->bucket, ": put ", i, " belongs to another bucket too"));
      }
      taken[i] = true;
      order.push_back(i);
    }
  }
  if (order.size() != n) {
    return absl::InternalError(
        absl::StrCat("the sent buckets hold ", order.size(), " of ", n, " puts"));
  }
  // Applied in place, cycle by cycle: each put and origin moves by swaps,
  // none is copied (this runs once per bind, on up to ~10^5 puts).
  for (size_t start = 0; start < n; ++start) {
    size_t k = start;
    while (order[k] != start) {
      const size_t next = order[k];
      std::swap(out.puts[k], out.puts[next]);
      std::swap(out.put_origins[k], out.put_origins[next]);
      order[k] = k;
      k = next;
    }
    order[k] = k;
  }
  for (size_t k = 0; k < sent.size(); ++k) sent[k]->first_put = first_puts[k];
  return absl::OkStatus();
}

}  // namespace wsync::exec::bind_internal
