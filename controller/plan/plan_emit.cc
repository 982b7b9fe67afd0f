// Stage 9: the v1::Plan. Bucket ids are dense in (round, sender, receiver,
// packing order); seq counts buckets of one (sender, receiver, round) by id;
// reduce ids are dense from 1 in (round, worker) order. Back-to-back
// transfers of a bucket that join into one box become one piece (MergePieces).
// With piece runs on, a bucket's plain pieces that step regularly become
// PieceRuns (RunGrouper, plan_emit_pieces.h): the bucket's `pieces` are then
// the others in packing order, its `runs` follow in order of first member.
// The ranks' ops and the summary: plan_summary.cc.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/plan_pieces.h"
#include "controller/plan/plan_emit_pieces.h"
#include "controller/plan/plan_views.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// Pieces a merged piece becomes: a sender-quantized delivery is its fp8
// piece followed by its scale piece.
int32_t PieceCount(const Work& w, const BucketRec& bk, const MergedPiece& mp) {
  return CarriesScales(w.cells[w.xfers[w.bucket_xfers[bk.xfer_begin + mp.first]].cell]) ? 2 : 1;
}

class Emitter {
 public:
  Emitter(const Work& w, bool piece_runs, v1::Plan* plan)
      : w_(w), plan_(plan), views_(plan->GetArena()), piece_runs_(piece_runs) {}

  absl::Status Run(bool summary_only) {
    Order();
    int64_t pieces = 0, relays = 0;
    if (!summary_only) {
      EmitNames();
      reduce_inputs_.assign(w_.reduces.size(), {});
      qinputs_.assign(w_.quants.size(), {});
      EmitBuckets(&pieces, &relays);
      EmitReduces();
      EmitQuantizes();
    } else {
      CountPieces(&pieces, &relays);
    }
    EmitRanksAndSummary(w_, {bucket_id_, seq_, reduce_id_, quant_id_}, pieces, relays, summary_only,
                        plan_);
    return absl::OkStatus();
  }

 private:
  void Order() {
    const int32_t nb = static_cast<int32_t>(w_.buckets.size());
    // Sorted by value (the keys next to each other, not behind an index).
    struct Key {
      int32_t round, sender, receiver, bucket;
      bool operator<(const Key& o) const {
        return std::tie(round, sender, receiver, bucket) <
               std::tie(o.round, o.sender, o.receiver, o.bucket);
      }
    };
    std::vector<Key> keys(nb);
    for (int32_t b = 0; b < nb; ++b) {
      const BucketRec& x = w_.buckets[b];
      keys[b] = {x.round, x.sender, x.receiver, b};
    }
    std::sort(keys.begin(), keys.end());
    bucket_order_.resize(nb);
    for (int32_t i = 0; i < nb; ++i) bucket_order_[i] = keys[i].bucket;
    bucket_id_.resize(nb);
    seq_.resize(nb);
    for (int32_t i = 0; i < nb; ++i) {
      const int32_t b = bucket_order_[i];
      bucket_id_[b] = i;
      const BucketRec& x = w_.buckets[b];
      if (i > 0) {
        const BucketRec& p = w_.buckets[bucket_order_[i - 1]];
        seq_[b] = (p.round == x.round && p.sender == x.sender && p.receiver == x.receiver)
                      ? seq_[bucket_order_[i - 1]] + 1
                      : 0;
      } else {
        seq_[b] = 0;
      }
    }
    const int32_t nr = static_cast<int32_t>(w_.reduces.size());
    reduce_order_.resize(nr);
    std::iota(reduce_order_.begin(), reduce_order_.end(), 0);
    std::sort(reduce_order_.begin(), reduce_order_.end(), [&](int32_t a, int32_t b) {
      const ReduceRec& x = w_.reduces[a];
      const ReduceRec& y = w_.reduces[b];
      return std::tie(x.round, x.receiver, a) < std::tie(y.round, y.receiver, b);
    });
    reduce_id_.resize(nr);
    for (int32_t i = 0; i < nr; ++i) reduce_id_[reduce_order_[i]] = i + 1;
    const int32_t nq = static_cast<int32_t>(w_.quants.size());
    quant_order_.resize(nq);
    std::iota(quant_order_.begin(), quant_order_.end(), 0);
    std::sort(quant_order_.begin(), quant_order_.end(), [&](int32_t a, int32_t b) {
      const QuantRec& x = w_.quants[a];
      const QuantRec& y = w_.quants[b];
      return std::tie(x.round, x.receiver, a) < std::tie(y.round, y.receiver, b);
    });
    quant_id_.resize(nq);
    for (int32_t i = 0; i < nq; ++i) quant_id_[quant_order_[i]] = i + 1;
  }

  // The fields of the view of box (off, len) in fragment `frag` of `t`;
  // they point into `len` and the fragment's strides.
  ViewFields Fields(bool dst_side, const CompiledTensor& t, int32_t frag, const int64_t* off,
                    const int64_t* len, int rank) const {
    const CompiledFragment& f = t.fragment(frag);
    ViewFields v;
    v.buffer_name = (dst_side ? dst_buffer_base_ : src_buffer_base_) + t.buffer(f);
    v.byte_offset = ViewByteOffset(f, off, DTypeSize(t.dtype));
    v.rank = rank;
    v.shape = len;
    v.strides = f.strides.data();
    v.dtype = t.dtype;
    v.side = dst_side ? v1::DESTINATION_BUFFER : v1::SOURCE_BUFFER;
    return v;
  }

  // A piece's source or destination view: the shared one on an arena
  // (plan_views.h), else its own.
  void SetSrc(const ViewFields& f, v1::Piece* p) {
    if (!views_.interning()) return FillView(f, p->mutable_src());
    p->unsafe_arena_set_allocated_src(views_.Get(f));
  }
  void SetDst(const ViewFields& f, v1::Piece* p) {
    if (!views_.interning()) return FillView(f, p->mutable_dst());
    p->unsafe_arena_set_allocated_dst(views_.Get(f));
  }

  // The scale piece of sender-quantized delivery `x`, packed by piece `index`.
  void FillScalePiece(const Xfer& x, int32_t index, v1::Piece* p) {
    const Cell& c = w_.cells[x.cell];
    const MapEntry& m = w_.maps[c.map];
    const CompiledTensor& dt = w_.dst->tensors[m.dst_tensor];
    const CompiledTensor& sc = w_.dst->tensors[dt.scale_tensor];
    int64_t doff[kMaxDims], dlen[kMaxDims], boff[kMaxDims], blen[kMaxDims];
    DstBox(c, doff, dlen);
    BlockBoxOf(dt, m.dst_rank, doff, dlen, boff, blen);
    p->set_tensor_name(dst_tensor_base_ + dt.scale_tensor);
    if (x.relay) {
      SetSrc(Fields(true, sc, dt.scale_fragment[x.src_frag], boff, blen, m.dst_rank), p);
      p->set_relay(true);
    } else {
      p->set_scales_of(index + 1);
    }
    SetDst(Fields(true, sc, dt.scale_fragment[x.dst_frag], boff, blen, m.dst_rank), p);
    p->set_bucket_offset(x.bucket_offset + QuantScaleOffset(c.elems));
    p->set_wire_dtype(v1::FP32);
  }

  // A cell's destination box (a kQuantGroup cell's box is one already).
  void DstBox(const Cell& c, int64_t* doff, int64_t* dlen) const {
    if (c.quant == kQuantGroup) {
      std::copy(w_.boxes.offset(c.box), w_.boxes.offset(c.box) + w_.boxes.rank(c.box), doff);
      std::copy(w_.boxes.length(c.box), w_.boxes.length(c.box) + w_.boxes.rank(c.box), dlen);
      return;
    }
    SrcToDst(w_.maps[c.map], w_.boxes.offset(c.box), w_.boxes.length(c.box), doff, dlen);
  }

  // A quantized region forwarded by a member that quantized it: fp8 piece
  // (its scale piece follows).
  void FillGroupPiece(const Xfer& x, v1::Piece* p) {
    const Cell& c = w_.cells[x.cell];
    const CompiledTensor& dt = w_.dst->tensors[w_.maps[c.map].dst_tensor];
    const int rank = w_.boxes.rank(c.box);
    int64_t doff[kMaxDims], dlen[kMaxDims];
    DstBox(c, doff, dlen);
    p->set_tensor_name(dst_tensor_base_ + w_.maps[c.map].dst_tensor);
    SetSrc(Fields(true, dt, x.src_frag, doff, dlen, rank), p);
    p->set_relay(true);
    SetDst(Fields(true, dt, x.dst_frag, doff, dlen, rank), p);
    p->set_bucket_offset(x.bucket_offset);
    p->set_wire_dtype(x.wire);
  }

  void FillPiece(const Xfer& x, const MergedPiece& mp, v1::Piece* p) {
    const Cell& c = w_.cells[x.cell];
    if (c.quant == kQuantGroup) return FillGroupPiece(x, p);
    const MapEntry& m = w_.maps[c.map];
    const CompiledTensor& st = w_.src->tensors[m.src_tensor];
    const CompiledTensor& dt = w_.dst->tensors[m.dst_tensor];
    const int64_t* so = mp.off;
    const int64_t* sl = mp.len;
    int64_t doff[kMaxDims], dlen[kMaxDims];
    SrcToDst(m, so, sl, doff, dlen);
    p->set_tensor_name(m.src_tensor);
    if (x.relay) {
      SetSrc(Fields(true, dt, x.src_frag, doff, dlen, m.dst_rank), p);
      p->set_relay(true);
    } else {
      SetSrc(Fields(false, st, x.src_frag, so, sl, m.src_rank), p);
    }
    SetDst(Fields(true, dt, x.dst_frag, doff, dlen, m.dst_rank), p);
    p->set_bucket_offset(x.bucket_offset);
    p->set_wire_dtype(x.wire);
    if (x.reduce != 0) p->set_reduce_id(reduce_id_[x.reduce - 1]);
    if (x.quantize != 0) p->set_quantize_id(quant_id_[x.quantize - 1]);
    if (c.quant == kQuantSender && !x.relay) {
      p->mutable_quant_block()->Reserve(2);  // one array, not two
      p->add_quant_block(dt.quant_block[0]);
      p->add_quant_block(dt.quant_block[1]);
    }
  }

  // Plan.names: source tensors, destination tensors, source buffers,
  // destination buffers, each side's list in its compiled order.
  void EmitNames() {
    auto* names = plan_->mutable_names();
    const CompiledSide& src = *w_.src;
    const CompiledSide& dst = *w_.dst;
    names->Reserve(static_cast<int>(src.tensors.size() + dst.tensors.size() +
                                    src.buffer_names.size() + dst.buffer_names.size()));
    for (const CompiledTensor& t : src.tensors) names->Add()->assign(t.name);
    dst_tensor_base_ = names->size();
    for (const CompiledTensor& t : dst.tensors) names->Add()->assign(t.name);
    src_buffer_base_ = names->size();
    for (const std::string& b : src.buffer_names) names->Add()->assign(b);
    dst_buffer_base_ = names->size();
    for (const std::string& b : dst.buffer_names) names->Add()->assign(b);
  }

  // Also counts the pieces and relayed pieces, and records where every
  // reduce and quantize input lands (bucket id, piece index): one merge of
  // each bucket's transfers serves all three.
  void EmitBuckets(int64_t* pieces, int64_t* relays) {
    auto* buckets = plan_->mutable_buckets();
    buckets->Reserve(static_cast<int>(bucket_order_.size()));
    for (size_t i = 0; i < bucket_order_.size(); ++i) {
      Prefetch(i);
      const int32_t b = bucket_order_[i];
      const BucketRec& bk = w_.buckets[b];
      v1::Bucket* out = buckets->Add();
      out->set_id(bucket_id_[b]);
      out->set_sender(w_.worker_ids[bk.sender]);
      out->set_receiver(w_.worker_ids[bk.receiver]);
      out->set_round(bk.round);
      out->set_bytes(bk.bytes);
      out->set_transport(bk.local ? v1::TRANSPORT_LOCAL : v1::TRANSPORT_NETWORK);
      out->set_zero_copy(bk.zero_copy);
      out->set_step(bk.step);
      out->set_seq(seq_[b]);
      MergePieces(w_, bk, &merged_);
      const bool runs = piece_runs_ && !bk.zero_copy && GroupRuns(bk);
      out->mutable_pieces()->Reserve(static_cast<int>(merged_.size()));
      for (size_t k = 0; k < merged_.size(); ++k) {
        if (runs && grouper_.run_of(static_cast<int32_t>(k)) >= 0) continue;
        const MergedPiece& mp = merged_[k];
        const Xfer& x = w_.xfers[w_.bucket_xfers[bk.xfer_begin + mp.first]];
        const int32_t index = out->pieces_size();
        if (x.reduce != 0) reduce_inputs_[x.reduce - 1].emplace_back(bucket_id_[b], index);
        if (x.quantize != 0) qinputs_[x.quantize - 1].push_back({bucket_id_[b], index, x.cell});
        FillPiece(x, mp, out->add_pieces());
        if (CarriesScales(w_.cells[x.cell])) FillScalePiece(x, index, out->add_pieces());
        const int32_t n = out->pieces_size() - index;
        *pieces += n;
        if (x.relay) *relays += n;
      }
      if (runs) EmitRuns(out, pieces, relays);
    }
  }

  // Groups the bucket's merged_ pieces into runs (grouper_, fields_): false
  // when none formed. Runs past the plan's budget of members
  // (kMaxRunMembers, what readers accept) stay plain pieces.
  bool GroupRuns(const BucketRec& bk) {
    const int32_t n = static_cast<int32_t>(merged_.size());
    if (n < 2) return false;
    fields_.resize(n);
    grouper_.Reset(n);
    for (int32_t k = 0; k < n; ++k) {
      const MergedPiece& mp = merged_[k];
      const Xfer& x = w_.xfers[w_.bucket_xfers[bk.xfer_begin + mp.first]];
      const Cell& c = w_.cells[x.cell];
      if (x.reduce != 0 || x.quantize != 0 || c.quant != 0) continue;
      PlainFields(x, mp, &fields_[k]);
      grouper_.Add(k, roles_.Of(x, mp), &fields_[k]);
    }
    grouper_.Finish();
    return grouper_.Budget(&run_members_, kMaxRunMembers);
  }

  // The bucket's runs (GroupRuns), after its plain pieces.
  void EmitRuns(v1::Bucket* out, int64_t* pieces, int64_t* relays) {
    out->mutable_runs()->Reserve(static_cast<int>(grouper_.runs().size()));
    for (const RunGrouper::Run& r : grouper_.runs()) {
      if (r.count == 0) continue;  // dissolved
      const PieceFields& f = fields_[r.first];
      v1::PieceRun* run = out->add_runs();
      v1::Piece* p = run->mutable_first();
      p->set_tensor_name(f.tensor_name);
      SetSrc(f.src.fields(), p);
      if (f.relay()) p->set_relay(true);
      SetDst(f.dst.fields(), p);
      p->set_bucket_offset(f.bucket_offset);
      p->set_wire_dtype(f.wire);
      SetCountAndSteps(r, run);
      *pieces += r.count;
      if (f.relay()) *relays += r.count;
    }
  }

  // The fields FillPiece writes for a plain piece (no reduce, quantize or
  // block fp8).
  void PlainFields(const Xfer& x, const MergedPiece& mp, PieceFields* f) const {
    const MapEntry& m = w_.maps[w_.cells[x.cell].map];
    const CompiledTensor& st = w_.src->tensors[m.src_tensor];
    const CompiledTensor& dt = w_.dst->tensors[m.dst_tensor];
    int64_t doff[kMaxDims], dlen[kMaxDims];
    SrcToDst(m, mp.off, mp.len, doff, dlen);
    f->src.Set(x.relay ? Fields(true, dt, x.src_frag, doff, dlen, m.dst_rank)
                       : Fields(false, st, x.src_frag, mp.off, mp.len, m.src_rank));
    f->dst.Set(Fields(true, dt, x.dst_frag, doff, dlen, m.dst_rank));
    f->tensor_name = m.src_tensor;
    f->bucket_offset = x.bucket_offset;
    f->wire = x.wire;
    int64_t elems = 1;
    for (int k = 0; k < m.dst_rank; ++k) elems *= dlen[k];
    f->wire_bytes = elems * DTypeSize(x.wire);
  }

  // A software pipeline over the buckets in emission order: for bucket
  // i + 4k it fetches level 5 - k of what emitting it reads (the bucket, its
  // transfer list, its transfers, their cells, then their boxes and the
  // fragments they read and write), each level's addresses coming from the
  // level fetched 4 buckets earlier. Every transfer of the bucket (up to
  // kPrefetchXfers), not only its first: merging and emitting read them all,
  // and emission was bound by these cache misses.
  void Prefetch(size_t i) const {
    const size_t n = bucket_order_.size();
    auto bucket = [&](size_t k) -> const BucketRec& { return w_.buckets[bucket_order_[k]]; };
    auto xfers = [&](const BucketRec& bk, auto&& fn) {
      const int32_t count = std::min(bk.xfer_count, kPrefetchXfers);
      for (int32_t j = 0; j < count; ++j) fn(w_.xfers[w_.bucket_xfers[bk.xfer_begin + j]]);
    };
    if (i + 20 < n) __builtin_prefetch(&w_.buckets[bucket_order_[i + 20]]);
    if (i + 16 < n) {
      const int32_t b = bucket_order_[i + 16];
      const BucketRec& bk = w_.buckets[b];
      const int32_t count = std::min(bk.xfer_count, kPrefetchXfers);
      for (int32_t j = 0; j < count; j += 16)
        __builtin_prefetch(&w_.bucket_xfers[bk.xfer_begin + j]);
      __builtin_prefetch(&bucket_id_[b]);
      __builtin_prefetch(&seq_[b]);
    }
    if (i + 12 < n) xfers(bucket(i + 12), [](const Xfer& x) { PrefetchObject(&x); });
    if (i + 8 < n)
      xfers(bucket(i + 8), [&](const Xfer& x) { __builtin_prefetch(&w_.cells[x.cell]); });
    if (i + 4 < n) {
      xfers(bucket(i + 4), [&](const Xfer& x) {
        const Cell& c = w_.cells[x.cell];
        __builtin_prefetch(w_.boxes.offset(c.box) - 1);
        const MapEntry& m = w_.maps[c.map];
        const CompiledTensor& dt = w_.dst->tensors[m.dst_tensor];
        const CompiledTensor& st = x.relay ? dt : w_.src->tensors[m.src_tensor];
        PrefetchObject(&dt.fragment(x.dst_frag));
        PrefetchObject(&st.fragment(x.src_frag));
      });
    }
  }

  static constexpr int32_t kPrefetchXfers = 32;

  template <typename T>
  static void PrefetchObject(const T* p) {
    const char* c = reinterpret_cast<const char*>(p);
    for (size_t o = 0; o < sizeof(T); o += 64) __builtin_prefetch(c + o);
  }

  void EmitReduces() {
    auto* reduces = plan_->mutable_reduces();
    reduces->Reserve(static_cast<int>(reduce_order_.size()));
    for (int32_t r : reduce_order_) {
      const ReduceRec& rr = w_.reduces[r];
      const Cell& c = w_.cells[rr.cell];
      const MapEntry& m = w_.maps[c.map];
      const CompiledTensor& st = w_.src->tensors[m.src_tensor];
      const CompiledTensor& dt = w_.dst->tensors[m.dst_tensor];
      int64_t doff[kMaxDims], dlen[kMaxDims];
      SrcToDst(m, w_.boxes.offset(c.box), w_.boxes.length(c.box), doff, dlen);
      v1::Reduce* out = reduces->Add();
      out->set_id(reduce_id_[r]);
      out->set_worker(w_.worker_ids[rr.receiver]);
      out->set_round(rr.round);
      out->set_op(rr.op);
      out->set_accumulate_dtype(st.dtype);
      FillView(Fields(true, dt, rr.dst_frag, doff, dlen, m.dst_rank), out->mutable_dst());
      std::vector<std::pair<int64_t, int32_t>>& inputs = reduce_inputs_[r];
      std::sort(inputs.begin(), inputs.end());
      for (auto [bucket, piece] : inputs) {
        v1::ReduceInput* in = out->add_inputs();
        in->set_bucket(bucket);
        in->set_piece(piece);
      }
    }
  }

  void EmitQuantizes() {
    auto* quants = plan_->mutable_quantizes();
    quants->Reserve(static_cast<int>(quant_order_.size()));
    for (int32_t q : quant_order_) {
      const QuantRec& qr = w_.quants[q];
      const QuantGroup& g = w_.qgroups[qr.qgroup];
      const CompiledTensor& dt = w_.dst->tensors[w_.dst_groups[g.dst_group].dst_tensor];
      const CompiledTensor& sc = w_.dst->tensors[dt.scale_tensor];
      const int rank = w_.boxes.rank(g.box);
      const int64_t* goff = w_.boxes.offset(g.box);
      const int64_t* glen = w_.boxes.length(g.box);
      int64_t boff[kMaxDims], blen[kMaxDims];
      BlockBoxOf(dt, rank, goff, glen, boff, blen);
      v1::Quantize* out = quants->Add();
      out->set_id(quant_id_[q]);
      out->set_worker(w_.worker_ids[qr.receiver]);
      out->set_round(qr.round);
      out->mutable_block()->Reserve(2);
      out->add_block(dt.quant_block[0]);
      out->add_block(dt.quant_block[1]);
      FillView(Fields(true, dt, qr.dst_frag, goff, glen, rank), out->mutable_dst());
      FillView(Fields(true, sc, dt.scale_fragment[qr.dst_frag], boff, blen, rank),
               out->mutable_scale_dst());
      std::vector<QInput>& in = qinputs_[q];
      std::sort(in.begin(), in.end(), [](const QInput& a, const QInput& b) {
        return std::tie(a.bucket, a.piece) < std::tie(b.bucket, b.piece);
      });
      for (const QInput& i : in) {
        v1::QuantizeInput* qi = out->add_inputs();
        qi->set_bucket(i.bucket);
        qi->set_piece(i.piece);
        const Cell& c = w_.cells[i.cell];
        const MapEntry& m = w_.maps[c.map];
        int64_t doff[kMaxDims], dlen[kMaxDims];
        SrcToDst(m, w_.boxes.offset(c.box), w_.boxes.length(c.box), doff, dlen);
        for (int d = 0; d < rank; ++d) qi->add_offset(doff[d] - goff[d]);
      }
    }
  }

  // Pieces of the buckets, and how many of them relays forward (summary_only:
  // EmitBuckets counts them otherwise).
  void CountPieces(int64_t* pieces, int64_t* relays) const {
    *pieces = 0;
    *relays = 0;
    for (const BucketRec& bk : w_.buckets) {
      MergePieces(w_, bk, &merged_);
      for (const MergedPiece& mp : merged_) {
        const int32_t n = PieceCount(w_, bk, mp);
        *pieces += n;
        if (w_.xfers[w_.bucket_xfers[bk.xfer_begin + mp.first]].relay) *relays += n;
      }
    }
  }

  const Work& w_;
  v1::Plan* plan_;
  ViewTable views_;
  int32_t dst_tensor_base_ = 0, src_buffer_base_ = 0, dst_buffer_base_ = 0;  // in Plan.names
  std::vector<int32_t> bucket_order_, bucket_id_, seq_, reduce_order_, reduce_id_;
  std::vector<int32_t> quant_order_, quant_id_;
  struct QInput {
    int64_t bucket;
    int32_t piece;
    int32_t cell;
  };
  std::vector<std::vector<QInput>> qinputs_;
  // Per reduce: its inputs (bucket id, piece index), filled by EmitBuckets.
  std::vector<std::vector<std::pair<int64_t, int32_t>>> reduce_inputs_;
  mutable std::vector<MergedPiece> merged_;
  const bool piece_runs_;
  RunGrouper grouper_;
  std::vector<PieceFields> fields_;  // per merged piece of the bucket
  PieceRoles roles_{w_};
  int64_t run_members_ = 0;  // in the plan's runs so far
};

}  // namespace

absl::Status Emit(const Work& w, bool summary_only, bool piece_runs, v1::Plan* plan) {
  return Emitter(w, piece_runs, plan).Run(summary_only);
}

}  // namespace wsync::plan::planner_detail
