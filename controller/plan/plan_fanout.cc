// Stage 2b: cells sized for routing, between BuildCells and ChooseSources.
// Cells are at most one working bucket, which can still be a large share of
// the whole sync when a few tensors dominate it. Two routing habits follow
// from a cell that is large against the plan's time scale:
//  * a tensor held by k replicas went out from one of them only: the cell is
//    cut into a multiple of k shares, which source choice spreads over the
//    holders (least loaded first);
//  * a tensor fanned out to N destinations moved as whole-cell relay hops,
//    one round each: the cell is cut into chunks (Cell::fan), each fed to a
//    root (the entry with the least NIC egress) and relayed from there in a
//    bucket of its own, so that the rounds pipeline: kFanChunksPerMember x N
//    chunks per tensor.
// The scale is the routing-independent data bound D2 (plan_bound.h): a cell
// is cut into pieces of at most D2 / kPiecesPerBound of link time, so that
// greedy source choice balances; cells below it (every cell of a plan whose
// time is spread over many tensors, e.g. Kimi-K2) stay whole. When one round
// is the cheaper bound (latency-bound transfers: latency + D1 <= latency +
// hop + D2, the hop a round or a step: BoundHopLatency), relays are switched
// off instead: every destination is fed by a holder in one round.
#include <algorithm>
#include <cmath>

#include "controller/plan/plan_source_loads.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// Pieces of link time per D2 a cell may be cut to: the rounds that pipeline
// a fan-out, and LPT's granularity over the holders.
constexpr double kPiecesPerBound = 32;
// At most this many pieces from one cell.
constexpr int64_t kMaxPiecesPerCell = 256;
// Chunks per receiver of a fanned-out cell (when its link time allows).
constexpr int64_t kFanChunksPerMember = 16;

class Splitter {
 public:
  explicit Splitter(Work* w) : w_(w) {}

  void Run(double data_seconds) {
    data_seconds_ = data_seconds;
    group_elems_.assign(w_->dst_groups.size(), 0);
    for (const Cell& c : w_->cells) group_elems_[c.dst_group] += c.elems;
    const double piece = data_seconds / kPiecesPerBound;
    if (!(piece > 0)) return;
    BigVector<Cell> out;
    out.reserve(w_->cells.size());
    bool changed = false;
    for (const Cell& c : w_->cells) {
      fan_ = false;
      const int64_t pieces = PiecesOf(c, piece);
      if (pieces <= 1) {
        out.push_back(c);
        out.back().fan = fan_;
        changed = changed || fan_;
        continue;
      }
      changed = true;
      Region box;
      box.rank = w_->boxes.rank(c.box);
      std::copy(w_->boxes.offset(c.box), w_->boxes.offset(c.box) + box.rank, box.off);
      std::copy(w_->boxes.length(c.box), w_->boxes.length(c.box) + box.rank, box.len);
      split_.clear();
      SplitElemBox(box, (c.elems + pieces - 1) / pieces, &split_);
      for (const Region& s : split_) {
        Cell part = c;
        part.fan = fan_;
        part.box = w_->boxes.Add(s.rank, s.off, s.len);
        part.elems = s.Elems();
        out.push_back(part);
      }
    }
    if (changed) w_->cells = std::move(out);
  }

 private:
  using Region = ElemBox;

  // Into how many pieces cell c is cut: 1 unless it is plain (no
  // quantization, full holders) and goes over the network, then enough
  // that each is at most `piece` seconds on its slowest link, at least its
  // holders' count, at most kMaxPiecesPerCell (and never below one element).
  int64_t PiecesOf(const Cell& c, double piece) {
    if (c.quant != 0) return 1;
    const CompiledTensor& st = w_->src->tensors[w_->SrcTensorOf(c)];
    const CompiledTensor& dt = w_->dst->tensors[w_->DstTensorOf(c)];
    holders_.clear();
    for (int32_t i = 0; i < c.hg_count; ++i) {
      const HolderGroup& hg = w_->holder_groups[w_->cell_holders[c.hg_begin + i]];
      for (int32_t k = 0; k < hg.full_count; ++k) {
        holders_.push_back(
            w_->src_rank_worker[st.fragment(w_->holder_frags[hg.full_begin + k]).rank]);
      }
    }
    if (holders_.empty()) return 1;
    std::sort(holders_.begin(), holders_.end());
    holders_.erase(std::unique(holders_.begin(), holders_.end()), holders_.end());
    const DstGroup& g = w_->dst_groups[c.dst_group];
    int32_t remote = 0;
    bool nic = false;
    for (int32_t m = 0; m < g.frag_count; ++m) {
      const int32_t wd = w_->dst_rank_worker[dt.fragment(g.frag_begin + m).rank];
      if (std::binary_search(holders_.begin(), holders_.end(), wd)) continue;
      ++remote;
      bool near = false;
      for (int32_t h : holders_) near = near || w_->Link(h, wd) == LinkClass::kNvlink;
      nic = nic || !near;
    }
    if (remote == 0) return 1;
    // More receivers than holders, relays on: the chunks fan out through
    // the receivers.
    fan_ = w_->opt.relay && remote >= 2 && remote > static_cast<int32_t>(holders_.size());
    // Nothing to spread: one holder, one receiver.
    if (holders_.size() == 1 && remote == 1) return 1;
    const int64_t bytes = CellWireBytes(*w_, c, CellWireDType(c, st, dt));
    const double t = LinkSeconds(w_->opt.link, nic ? LinkClass::kNic : LinkClass::kNvlink, bytes);
    int64_t n = t > piece ? static_cast<int64_t>(std::ceil(t / piece)) : 1;
    // Only a tensor that is a sizeable part of the sync fans out in chunks
    // (its cells' link time together above `piece`); the others keep the
    // greedy routing and share buckets.
    const double group_t = t * static_cast<double>(group_elems_[c.dst_group]) /
                           static_cast<double>(std::max<int64_t>(1, c.elems));
    fan_ = fan_ && group_t > piece;
    if (fan_) {
      // Fan-out: kFanChunksPerMember chunks per receiver for the tensor, so
      // that every round the round search settles on carries several chunks
      // per root (the rounds, and so the latency paid, are the round
      // search's choice). This cell takes its part by its part of D2.
      n = std::max<int64_t>(
          n, static_cast<int64_t>(std::ceil(kFanChunksPerMember * remote * t / data_seconds_)));
    } else if (n <= 1) {
      return 1;
    }
    // Shares: a multiple of the holders, so that each sends the same.
    const int64_t k = static_cast<int64_t>(holders_.size());
    n = (n + k - 1) / k * k;
    // A share keeps the zero-copy size (zero_copy_min_bytes) of a cell that
    // has it: staging it would cost more than the balance gained.
    if (!fan_ && bytes >= w_->opt.zero_copy_min) {
      n = std::min(n, bytes / std::max<int64_t>(1, w_->opt.zero_copy_min));
    }
    n = std::min<int64_t>({n, kMaxPiecesPerCell, c.elems});
    if (n <= 1) return 1;
    // Fan-out: every receiver is root of as many chunks.
    if (fan_ && n > remote) n = n / remote * remote;
    return n;
  }

  Work* w_;
  std::vector<int32_t> holders_;
  std::vector<Region> split_;
  bool fan_ = false;  // PiecesOf's cell fans out
  double data_seconds_ = 0;
  std::vector<int64_t> group_elems_;  // per DstGroup: elements of its cells
};

}  // namespace

void PlanFanRoute(const std::vector<int32_t>& frags, const std::vector<int32_t>& frag_node,
                  int32_t turn, FanRoute* out) {
  out->nodes.clear();
  out->entry.clear();
  std::vector<int32_t> node_ids;  // node of each group, in order of first appearance
  for (size_t i = 0; i < frags.size(); ++i) {
    const auto it = std::find(node_ids.begin(), node_ids.end(), frag_node[i]);
    if (it == node_ids.end()) {
      node_ids.push_back(frag_node[i]);
      out->nodes.push_back({frags[i]});
    } else {
      out->nodes[it - node_ids.begin()].push_back(frags[i]);
    }
  }
  const int32_t nodes = static_cast<int32_t>(out->nodes.size());
  out->root = nodes == 0 ? 0 : turn % nodes;
  for (int32_t n = 0; n < nodes; ++n) {
    const std::vector<int32_t>& m = out->nodes[n];
    out->entry.push_back(m[(turn / nodes + n) % static_cast<int32_t>(m.size())]);
  }
}

void SplitCellsForRouting(Work* w, double data_seconds, double one_round_seconds) {
  const double lat = w->opt.link.round_latency_seconds();
  // Latency-bound: one round of direct sends is the better bound; relays
  // would only add rounds (or steps).
  // (Receiver-quantized regions rooted for relays keep them.)
  bool rooted = false;
  for (const QuantGroup& q : w->qgroups) rooted = rooted || q.rooted;
  if (w->opt.relay && !rooted &&
      lat + one_round_seconds <= lat + BoundHopLatency(*w) + data_seconds) {
    w->opt.relay = false;
  }
  Splitter(w).Run(data_seconds);
}

}  // namespace wsync::plan::planner_detail
