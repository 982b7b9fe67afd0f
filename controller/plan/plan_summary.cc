// Stage 9, second half: every worker's RankPlan (its ops by round), the
// plan's worker list and its summary (bytes, ops, staging, link-model cost).
// Per worker and round, ops go SEND/RECV by (peer, seq), then COPY, then
// REDUCE, then QUANTIZE.
#include <algorithm>
#include <tuple>
#include <vector>

#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

struct OpRec {
  int32_t worker;
  int32_t round;
  int8_t cls;  // 0 send/recv, 1 copy, 2 reduce, 3 quantize
  int32_t peer;
  int32_t seq;
  int8_t kind;  // v1::Op::Kind
  int64_t id;   // bucket or reduce id
  bool operator<(const OpRec& o) const {
    return std::tie(worker, round, cls, peer, seq, kind, id) <
           std::tie(o.worker, o.round, o.cls, o.peer, o.seq, o.kind, o.id);
  }
};

// Per-worker totals (indexed by worker index) and plan totals.
struct Tally {
  Tally(int32_t nw, int32_t nr)
      : nw(nw),
        out_b(nw, 0),
        in_b(nw, 0),
        local_b(nw, 0),
        ops(nw, 0),
        staged(static_cast<size_t>(nr) * nw, 0) {}

  int64_t& Staged(int32_t round, int32_t worker) {
    return staged[static_cast<size_t>(round) * nw + worker];
  }

  int32_t nw;
  std::vector<int64_t> out_b, in_b, local_b, ops;
  std::vector<int64_t> staged;  // [round][worker]: staged bucket bytes
  int64_t network = 0, local = 0, dest = 0;
};

// Bytes, ops, staging and link cost of every bucket; its ops into `recs`
// (when not null).
void TallyBuckets(const Work& w, const EmittedIds& ids, Tally* t, CostModel* cost,
                  std::vector<OpRec>* recs) {
  for (size_t b = 0; b < w.buckets.size(); ++b) {
    const BucketRec& bk = w.buckets[b];
    cost->Add(w.SlotOf(bk), bk.sender, bk.receiver, w.Link(bk.sender, bk.receiver), bk.bytes);
    if (bk.local) {
      t->local += bk.bytes;
      t->local_b[bk.sender] += bk.bytes;
      ++t->ops[bk.sender];
      if (recs != nullptr) {
        recs->push_back({bk.sender, bk.round, 1, 0, 0, v1::Op::COPY, ids.bucket_id[b]});
      }
      continue;
    }
    t->network += bk.bytes;
    t->out_b[bk.sender] += bk.bytes;
    t->in_b[bk.receiver] += bk.bytes;
    ++t->ops[bk.sender];
    ++t->ops[bk.receiver];
    if (!bk.zero_copy) {
      t->Staged(bk.round, bk.sender) += bk.bytes;
      t->Staged(bk.round, bk.receiver) += bk.bytes;
    }
    if (recs != nullptr) {
      recs->push_back({bk.sender, bk.round, 0, w.worker_ids[bk.receiver], ids.seq[b], v1::Op::SEND,
                       ids.bucket_id[b]});
      recs->push_back({bk.receiver, bk.round, 0, w.worker_ids[bk.sender], ids.seq[b], v1::Op::RECV,
                       ids.bucket_id[b]});
    }
  }
}

// Ops and destination bytes of every reduce and quantize (fp8 + scales);
// their ops into `recs` (when not null).
void TallyReducesAndQuantizes(const Work& w, const EmittedIds& ids, Tally* t,
                              std::vector<OpRec>* recs) {
  for (size_t r = 0; r < w.reduces.size(); ++r) {
    const ReduceRec& rr = w.reduces[r];
    ++t->ops[rr.receiver];
    const CompiledTensor& dt = w.dst->tensors[w.DstTensorOf(w.cells[rr.cell])];
    t->dest += w.cells[rr.cell].elems * DTypeSize(dt.dtype);
    if (recs != nullptr) {
      recs->push_back({rr.receiver, rr.round, 2, 0, 0, v1::Op::REDUCE, ids.reduce_id[r]});
    }
  }
  for (size_t q = 0; q < w.quants.size(); ++q) {
    const QuantRec& qr = w.quants[q];
    ++t->ops[qr.receiver];
    const QuantGroup& g = w.qgroups[qr.qgroup];
    const CompiledTensor& dt = w.dst->tensors[w.dst_groups[g.dst_group].dst_tensor];
    const int rank = w.boxes.rank(g.box);
    int64_t boff[kMaxDims], blen[kMaxDims];
    BlockBoxOf(dt, rank, w.boxes.offset(g.box), w.boxes.length(g.box), boff, blen);
    int64_t blocks = 1;
    for (int d = 0; d < rank; ++d) blocks *= blen[d];
    t->dest += w.boxes.elems(g.box) * DTypeSize(dt.dtype) + blocks * 4;
    if (recs != nullptr) {
      recs->push_back({qr.receiver, qr.round, 3, 0, 0, v1::Op::QUANTIZE, ids.quant_id[q]});
    }
  }
  // Transfers written straight into their destination (not reduce or
  // quantize inputs).
  for (const Xfer& x : w.xfers) {
    if (x.reduce != 0 || x.quantize != 0) continue;
    const Cell& c = w.cells[x.cell];
    const CompiledTensor& dt = w.dst->tensors[w.DstTensorOf(c)];
    t->dest += c.elems * DTypeSize(dt.dtype) + c.scales * 4;
  }
}

// One RankPlan per worker with ops, rounds in order, from `recs` (sorted here).
// Every array is reserved to its final size (counted ahead in the sorted
// records): on the plan's arena each growth step would leave the old array
// behind.
void EmitRankPlans(const Work& w, Tally& t, std::vector<OpRec>* recs, v1::Plan* plan) {
  std::sort(recs->begin(), recs->end());
  const size_t n = recs->size();
  auto run_end = [&](size_t i, bool same_round) {
    const OpRec& o = (*recs)[i];
    size_t j = i + 1;
    while (j < n && (*recs)[j].worker == o.worker && (!same_round || (*recs)[j].round == o.round)) {
      ++j;
    }
    return j;
  };
  {
    int workers = 0;
    for (size_t i = 0; i < n; i = run_end(i, false)) ++workers;
    plan->mutable_ranks()->Reserve(workers);
  }
  v1::RankPlan* rp = nullptr;
  v1::Round* round = nullptr;
  for (size_t i = 0; i < n; ++i) {
    const OpRec& o = (*recs)[i];
    if (rp == nullptr || rp->worker() != w.worker_ids[o.worker]) {
      rp = plan->add_ranks();
      rp->set_worker(w.worker_ids[o.worker]);
      round = nullptr;
      int rounds = 0;
      for (size_t j = i, end = run_end(i, false); j < end; j = run_end(j, true)) ++rounds;
      rp->mutable_rounds()->Reserve(rounds);
    }
    if (round == nullptr || round->index() != o.round) {
      round = rp->add_rounds();
      round->set_index(o.round);
      round->set_staging_bytes(t.Staged(o.round, o.worker));
      round->mutable_ops()->Reserve(static_cast<int>(run_end(i, true) - i));
    }
    v1::Op* op = round->add_ops();
    op->set_kind(static_cast<v1::Op::Kind>(o.kind));
    if (o.kind == v1::Op::REDUCE) {
      op->set_reduce(o.id);
    } else if (o.kind == v1::Op::QUANTIZE) {
      op->set_quantize(o.id);
    } else {
      op->set_bucket(o.id);
      if (o.kind != v1::Op::COPY) op->set_peer(o.peer);
    }
  }
}

// The summary's per-worker rows and totals.
void FillSummary(const Work& w, const Tally& t, const std::vector<int64_t>& peak, int64_t peak_all,
                 int64_t pieces, int64_t relay_pieces, const CostReport& rep, v1::PlanSummary* s) {
  s->set_destination_bytes(t.dest);
  s->set_network_bytes(t.network);
  s->set_local_bytes(t.local);
  s->set_num_rounds(w.num_rounds);
  s->set_num_buckets(static_cast<int64_t>(w.buckets.size()));
  s->set_num_pieces(pieces);
  int64_t total_ops = 0;
  for (int64_t o : t.ops) total_ops += o;
  s->set_num_ops(total_ops);
  s->set_num_relay_pieces(relay_pieces);
  s->set_num_quantizes(static_cast<int64_t>(w.quants.size()));
  s->set_max_rank_bytes_out(*std::max_element(t.out_b.begin(), t.out_b.end()));
  s->set_max_rank_bytes_in(*std::max_element(t.in_b.begin(), t.in_b.end()));
  s->set_peak_staging_bytes(peak_all);
  s->set_predicted_seconds(w.num_rounds == 0 ? 0 : rep.predicted_seconds);
  s->set_lower_bound_seconds(rep.lower_bound_seconds);
  s->set_routing_bound_seconds(w.routing_bound_seconds);
  s->set_routing_bound_term(w.routing_bound_term);
  s->mutable_ranks()->Reserve(t.nw);
  for (int32_t k = 0; k < t.nw; ++k) {
    v1::RankSummary* rs = s->add_ranks();
    rs->set_worker(w.worker_ids[k]);
    rs->set_bytes_out(t.out_b[k]);
    rs->set_bytes_in(t.in_b[k]);
    rs->set_bytes_local(t.local_b[k]);
    rs->set_peak_staging_bytes(peak[k]);
    rs->set_ops(t.ops[k]);
    rs->set_busy_seconds(rep.worker_busy_seconds[k]);
  }
}

}  // namespace

void EmitRanksAndSummary(const Work& w, const EmittedIds& ids, int64_t pieces, int64_t relay_pieces,
                         bool summary_only, v1::Plan* plan) {
  const int32_t nw = static_cast<int32_t>(w.worker_ids.size());
  const int32_t nr = std::max(1, w.num_rounds);
  Tally t(nw, nr);
  CostModel cost(w.opt.link, nw, std::max(1, w.NumSlots()));
  std::vector<OpRec> recs;
  if (!summary_only) recs.reserve(w.buckets.size() * 2 + w.reduces.size());
  TallyBuckets(w, ids, &t, &cost, summary_only ? nullptr : &recs);
  TallyReducesAndQuantizes(w, ids, &t, summary_only ? nullptr : &recs);
  std::vector<int64_t> peak(nw, 0);
  int64_t peak_all = 0;
  for (int32_t r = 0; r < nr; ++r) {
    for (int32_t k = 0; k < nw; ++k) {
      peak[k] = std::max(peak[k], t.Staged(r, k));
      peak_all = std::max(peak_all, peak[k]);
    }
  }
  if (!summary_only) EmitRankPlans(w, t, &recs, plan);
  const CostReport rep = cost.Report(w.round_first_slot);
  plan->set_num_rounds(w.num_rounds);
  plan->mutable_workers()->Reserve(nw);
  for (int32_t k = 0; k < nw; ++k) {
    v1::WorkerInfo* wi = plan->add_workers();
    wi->set_worker(w.worker_ids[k]);
    wi->set_node(w.node_names[w.worker_node[k]]);
  }
  FillSummary(w, t, peak, peak_all, pieces, relay_pieces, rep, plan->mutable_summary());
}

}  // namespace wsync::plan::planner_detail
