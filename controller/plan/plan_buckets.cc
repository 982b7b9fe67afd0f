// Stage 7: pack transfers per (sender, receiver) into buckets of at most
// the working bucket size (pack_bytes, at most bucket_bytes; smaller in
// relay-bound plans, Packer::PlainLimit). Transfers of one relay generation and partial
// contributions get buckets of their own so that round constraints stay local. A transfer that is
// contiguous on both sides, uncast and at least zero_copy_min_bytes becomes a zero-copy bucket of
// its own (no staging). Local transfers (sender == receiver) are buckets like any other, with
// TRANSPORT_LOCAL: a self-copy is never dropped. A chunk of a fanned-out cell (Cell::fan) has a
// bucket of its own, so that its relays pipeline behind it.
#include <algorithm>

#include "controller/plan/plan_cost.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// A relay-bound plan's buckets take at most 1 / kRoundShares of a pipeline
// round's link time (Packer::PlainLimit).
constexpr double kRoundShares = 3;

// With `any_size_fan_chunks` (a schedule searched for steps), fanned-out
// chunks qualify at any size: a relay forwards within a round only from a
// zero-copy receive.
bool ZeroCopyEligible(const Work& w, const Xfer& x, bool any_size_fan_chunks) {
  if (x.reduce != 0 || x.quantize != 0) return false;
  const bool fan_chunk = any_size_fan_chunks && w.cells[x.cell].fan;
  if (x.bytes < w.opt.zero_copy_min && !fan_chunk) return false;
  const Cell& c = w.cells[x.cell];
  const MapEntry& m = w.maps[c.map];
  const CompiledTensor& st = w.src->tensors[m.src_tensor];
  const CompiledTensor& dt = w.dst->tensors[m.dst_tensor];
  if (st.dtype != dt.dtype || x.wire != dt.dtype) return false;
  int64_t doff[kMaxDims], dlen[kMaxDims];
  SrcToDst(m, w.boxes.offset(c.box), w.boxes.length(c.box), doff, dlen);
  const CompiledFragment& df = dt.fragment(x.dst_frag);
  if (!Contiguous(m.dst_rank, dlen, df.strides.data())) return false;
  if (x.relay) return Contiguous(m.dst_rank, dlen, dt.fragment(x.src_frag).strides.data());
  return Contiguous(m.src_rank, w.boxes.length(c.box), st.fragment(x.src_frag).strides.data());
}

}  // namespace

double RelayHopLatency(const Work& w) {
  const v1::LinkModel& lm = w.opt.link;
  if (!StepsPay(lm)) return lm.round_latency_seconds();
  for (const Xfer& x : w.xfers) {
    if (x.relay && x.parent >= 0 && ZeroCopyEligible(w, x, true) &&
        ZeroCopyEligible(w, w.xfers[x.parent], true)) {
      return lm.step_latency_seconds();
    }
  }
  return lm.round_latency_seconds();
}

namespace {

// Transfer ids in (sender, receiver) runs, each run in creation order:
// stable counting sorts by receiver, then by sender, O(n).
std::vector<int32_t> PairOrder(const Work& w) {
  const size_t nw = w.worker_ids.size();
  const size_t nx = w.xfers.size();
  std::vector<int32_t> by_recv(nx), order(nx);
  {
    std::vector<int32_t> start(nw + 1, 0);
    for (const Xfer& x : w.xfers) ++start[x.receiver + 1];
    for (size_t i = 0; i < nw; ++i) start[i + 1] += start[i];
    for (size_t i = 0; i < nx; ++i) by_recv[start[w.xfers[i].receiver]++] = static_cast<int32_t>(i);
  }
  std::vector<int32_t> start(nw + 1, 0);
  for (const Xfer& x : w.xfers) ++start[x.sender + 1];
  for (size_t i = 0; i < nw; ++i) start[i + 1] += start[i];
  for (int32_t i : by_recv) order[start[w.xfers[i].sender]++] = i;
  return order;
}

// One class at a time: (generation, partial) in a fixed order; the parts of
// one quantization batch next to each other (they share buckets).
void SortByClass(const Work& w, std::vector<int32_t>* run) {
  std::stable_sort(run->begin(), run->end(), [&](int32_t a, int32_t b) {
    const Xfer& xa = w.xfers[a];
    const Xfer& xb = w.xfers[b];
    if (xa.gen != xb.gen) return xa.gen < xb.gen;
    const bool pa = xa.reduce != 0 || xa.quantize != 0, pb = xb.reduce != 0 || xb.quantize != 0;
    if (pa != pb) return pb;
    const int32_t ba = xa.quantize != 0 ? w.quants[xa.quantize - 1].batch : -1;
    const int32_t bb = xb.quantize != 0 ? w.quants[xb.quantize - 1].batch : -1;
    return ba < bb;
  });
}

class Packer {
 public:
  explicit Packer(Work* w)
      : w_(w),
        limit_(PlainLimit(*w)),
        stepping_(w->hop_latency < w->opt.link.round_latency_seconds()) {}

  // pack_bytes, or less in a relay-bound plan: there the holders' sends and
  // the relays behind them pipeline round by round, best over about
  // PipelineRoundCount rounds of the routing bound (plan_rounds.cc tries
  // counts near it for plans of up to 50,000 units, which the smaller
  // buckets may push past: Llama-3-8B to 32 replicas), and a bucket
  // longer than 1 / kRoundShares of such a round on the NIC (NVLink where no
  // transfer crosses nodes) leaves the rounds uneven. Never below
  // min(pack_bytes, 4 MiB). (Limits per link class, NVLink buckets a third of
  // the round on NVLink, did worse on bench/plan_rounds_quality.sh:
  // Llama-3-8B to 32 replicas 1.273 -> 1.317.)
  static int64_t PlainLimit(const Work& w) {
    const int64_t pack = w.opt.pack_bytes;
    int32_t depth = 0;
    bool nic = false;
    for (const Xfer& x : w.xfers) {
      depth = std::max<int32_t>(depth, x.gen);
      nic = nic || w.Link(x.sender, x.receiver) == LinkClass::kNic;
    }
    const double t = w.routing_bound_seconds;
    const double rounds = PipelineRoundCount(depth, t, w.hop_latency);
    if (!(rounds > 0)) return pack;
    const double rate =
        nic ? w.opt.link.nic_bytes_per_second() : w.opt.link.nvlink_bytes_per_second();
    const double bytes = t / rounds / kRoundShares * rate;
    const int64_t min_limit = std::min<int64_t>(pack, int64_t{4} << 20);
    if (!(bytes < static_cast<double>(pack))) return pack;
    return std::max<int64_t>(min_limit, static_cast<int64_t>(bytes));
  }

  // Packs one (sender, receiver) run, sorted by class, into buckets.
  void PackRun(const std::vector<int32_t>& run) {
    bool open = false;
    int cls_gen = -1, cls_partial = -1;
    int32_t cls_reduce = -1;
    int64_t limit = 0;
    for (int32_t xi : run) {
      const Xfer& x = w_->xfers[xi];
      if (ZeroCopyEligible(*w_, x, stepping_)) {
        OpenBucket(x);
        Add(xi, 0);
        w_->buckets.back().zero_copy = true;
        open = false;
        continue;
      }
      // A chunk of a fanned-out cell travels alone: packed with the run's
      // other chunks it would tie their relay hops into one round.
      if (w_->cells[x.cell].fan) {
        OpenBucket(x);
        Add(xi, 0);
        open = false;
        continue;
      }
      // Inputs of one reduce or of one receiver-side quantization share a
      // round: one of them per bucket.
      const bool partial = x.reduce != 0 || x.quantize != 0;
      const int32_t unit_key =
          x.reduce != 0 ? x.reduce : -1 - (x.quantize != 0 ? w_->quants[x.quantize - 1].batch : 0);
      // Sender-quantized deliveries carry fp32 scales after their fp8 bytes.
      const int64_t align = CarriesScales(w_->cells[x.cell]) ? 4 : DTypeSize(x.wire);
      int64_t offset = open ? (w_->buckets.back().bytes + align - 1) / align * align : 0;
      // One reduce per partial bucket: a reduce's buckets share a round, so
      // mixing reduces would chain them into units beyond the staging cap.
      if (!open || x.gen != cls_gen || static_cast<int>(partial) != cls_partial ||
          (partial && unit_key != cls_reduce) || offset + x.bytes > limit) {
        OpenBucket(x);
        open = true;
        cls_gen = x.gen;
        cls_partial = partial;
        limit = BucketLimit(x);
        cls_reduce = unit_key;
        offset = 0;
      }
      Add(xi, offset);
    }
  }

 private:
  // The most bytes a bucket opened by x may hold: a reduce's contributions
  // leave room for all its members' within the staging cap.
  int64_t BucketLimit(const Xfer& x) const {
    if (x.reduce == 0) return limit_;
    return std::min(
        limit_, std::max(x.bytes, w_->opt.staging_cap / (w_->reduces[x.reduce - 1].members + 1)));
  }

  void OpenBucket(const Xfer& x) {
    BucketRec b;
    b.sender = x.sender;
    b.receiver = x.receiver;
    b.local = x.sender == x.receiver;
    b.xfer_begin = static_cast<int32_t>(w_->bucket_xfers.size());
    w_->buckets.push_back(b);
  }

  void Add(int32_t xi, int64_t offset) {
    Xfer& x = w_->xfers[xi];
    BucketRec& b = w_->buckets.back();
    x.bucket = static_cast<int32_t>(w_->buckets.size()) - 1;
    x.bucket_offset = offset;
    b.bytes = offset + x.bytes;
    ++b.xfer_count;
    w_->bucket_xfers.push_back(xi);
  }

  Work* w_;
  const int64_t limit_;  // PlainLimit
  const bool stepping_;  // a schedule for steps: fanned-out chunks zero-copy at any size
};

}  // namespace

absl::Status PackBuckets(Work* w) {
  w->buckets.clear();
  w->bucket_xfers.clear();
  const size_t nx = w->xfers.size();
  const std::vector<int32_t> order = PairOrder(*w);
  w->bucket_xfers.reserve(nx);
  Packer packer(w);
  std::vector<int32_t> run;
  for (size_t i = 0; i < nx;) {
    size_t e = i;
    while (e < nx && w->xfers[order[e]].sender == w->xfers[order[i]].sender &&
           w->xfers[order[e]].receiver == w->xfers[order[i]].receiver) {
      ++e;
    }
    run.assign(order.begin() + i, order.begin() + e);
    SortByClass(*w, &run);
    packer.PackRun(run);
    i = e;
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan::planner_detail
