// The routing-independent bound (plan_bound.h): one pass over the cells
// accumulating bytes per worker, holder set and node, then each term's
// seconds.
#include "controller/plan/plan_bound.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/plan/plan_source_loads.h"

namespace wsync::plan::planner_detail {
namespace {

// Bytes of one holder set: leaving it (at least once; with no relay, once per
// receiver), and the part that cannot leave over NVLink.
struct SetBytes {
  double out = 0, out_nic = 0;    // with relays
  double out1 = 0, out1_nic = 0;  // one round: a copy per receiver
};

struct WorkerBytes {
  double in = 0, in_nic = 0, in1_nic = 0, local = 0;
};

// Seconds to move `bytes` at `rate` (none to move: 0, whatever the rate).
double Over(double bytes, double rate) { return bytes > 0 ? bytes / rate : 0.0; }

// The largest term so far and what it is.
struct Max {
  double seconds = 0;
  std::string what;
  void Offer(double s, const std::string& w) {
    if (s > seconds) seconds = s, what = w;
  }
};

class BoundBuilder {
 public:
  explicit BoundBuilder(const Work& w)
      : w_(w),
        nw_(static_cast<int32_t>(w.worker_ids.size())),
        workers_(nw_),
        node_size_(w.node_names.size(), 0),
        node_in_(w.node_names.size(), 0),
        node_out_(w.node_names.size(), 0),
        node_seen_(w.node_names.size(), -1),
        node_members_(w.node_names.size(), 0) {
    for (int32_t n : w.worker_node) ++node_size_[n];
  }

  RoutingBound Run() {
    for (size_t i = 0; i < w_.cells.size(); ++i) AddCell(static_cast<int32_t>(i));
    return Terms();
  }

 private:
  // Full holders' workers (sorted, unique) and partial members' workers.
  void Holders(const Cell& c, const CompiledTensor& st) {
    full_.clear();
    part_.clear();
    part_end_.clear();
    for (int32_t i = 0; i < c.hg_count; ++i) {
      const HolderGroup& hg = w_.holder_groups[w_.cell_holders[c.hg_begin + i]];
      for (int32_t k = 0; k < hg.full_count; ++k) {
        full_.push_back(w_.src_rank_worker[st.fragment(w_.holder_frags[hg.full_begin + k]).rank]);
      }
      for (int32_t k = 0; k < hg.part_count; ++k) {
        const PartialGroup& pg = w_.partial_groups[w_.holder_parts[hg.part_begin + k]];
        for (int32_t m = 0; m < pg.frag_count; ++m) {
          part_.push_back(w_.src_rank_worker[st.fragment(w_.holder_frags[pg.frag_begin + m]).rank]);
        }
        part_end_.push_back(static_cast<int32_t>(part_.size()));
      }
    }
    std::sort(full_.begin(), full_.end());
    full_.erase(std::unique(full_.begin(), full_.end()), full_.end());
  }

  // Whether `worker` can fill the cell from its own memory: a full holder,
  // or every member of one partial group.
  bool Holds(int32_t worker) const {
    if (std::binary_search(full_.begin(), full_.end(), worker)) return true;
    int32_t begin = 0;
    for (int32_t end : part_end_) {
      bool all = begin < end;
      for (int32_t i = begin; i < end; ++i) all = all && part_[i] == worker;
      if (all) return true;
      begin = end;
    }
    return false;
  }

  // Whether a holder (full, or a partial member) other than `worker` is on
  // its node.
  bool HolderOnNode(int32_t worker) const {
    const int32_t n = w_.worker_node[worker];
    for (int32_t h : full_) {
      if (h != worker && w_.worker_node[h] == n) return true;
    }
    for (int32_t h : part_) {
      if (h != worker && w_.worker_node[h] == n) return true;
    }
    return false;
  }

  int32_t SetOf(const Cell& c) {
    auto [it, inserted] = range_set_.try_emplace(std::make_pair(c.hg_begin, c.hg_count), 0);
    if (inserted) {
      auto [s, fresh] = set_id_.try_emplace(full_, static_cast<int32_t>(sets_.size()));
      if (fresh) {
        sets_.emplace_back();
        set_workers_.push_back(full_);
      }
      it->second = s->second;
    }
    return it->second;
  }

  void AddCell(int32_t ci) {
    const Cell& c = w_.cells[ci];
    const CompiledTensor& st = w_.src->tensors[w_.SrcTensorOf(c)];
    const CompiledTensor& dt = w_.dst->tensors[w_.DstTensorOf(c)];
    const DstGroup& g = w_.dst_groups[c.dst_group];
    const bool rooted = c.quant == kQuantReceiver && w_.qgroups[c.qgroup].rooted;
    // A rooted region's members need at least its fp8 result (the kQuantGroup
    // cell, counted as ingress); its parts only have to leave their holders.
    const bool count_in = !rooted;
    const bool count_out = c.quant != kQuantGroup;
    Holders(c, st);
    double b = static_cast<double>(CellWireBytes(w_, c, CellWireDType(c, st, dt)));
    if (full_.empty() && c.quant != kQuantGroup) {
      b = static_cast<double>(c.elems * std::min(DTypeSize(st.dtype), DTypeSize(dt.dtype)));
    }
    // Parts quantized at the receiver leave their holders in the source dtype,
    // but another routing (a root relaying the fp8 result) could bring a
    // member as little as one byte per element.
    const double b_in = c.quant == kQuantReceiver ? static_cast<double>(c.elems) : b;
    // Members per node (to tell whether a node-mate needs the cell too).
    members_.clear();
    for (int32_t m = 0; m < g.frag_count; ++m) {
      members_.push_back(w_.dst_rank_worker[dt.fragment(g.frag_begin + m).rank]);
    }
    for (int32_t wd : members_) ++node_members_[w_.worker_node[wd]];
    const bool by_holders = count_out && !full_.empty();
    int32_t leaving = 0, leaving_nic = 0;
    for (int32_t wd : members_) {
      const int32_t n = w_.worker_node[wd];
      if (Holds(wd)) {
        workers_[wd].local += b_in;
        continue;
      }
      ++leaving;
      const bool holder_near = HolderOnNode(wd);
      if (!holder_near) ++leaving_nic;
      if (count_in) {
        WorkerBytes& wb = workers_[wd];
        wb.in += b_in;
        if (!holder_near && node_members_[n] < 2) wb.in_nic += b_in;
        if (!holder_near) wb.in1_nic += b_in;
      }
      // A node none of whose workers holds the cell takes it in once.
      if (by_holders && !holder_near && node_seen_[n] != ci) {
        node_seen_[n] = ci;
        node_in_[n] += b_in;
      }
    }
    for (int32_t wd : members_) node_members_[w_.worker_node[wd]] = 0;
    if (!by_holders || leaving == 0) return;
    SetBytes& s = sets_[SetOf(c)];
    s.out += b;
    s.out1 += b * leaving;
    s.out1_nic += b * leaving_nic;
    // Every needing worker off the holders' nodes: the first hop is a NIC hop.
    if (leaving_nic == leaving) s.out_nic += b;
    // Bytes only one node holds, needed on another, leave it over its NICs.
    const int32_t hn = w_.worker_node[full_[0]];
    bool one_node = true;
    for (int32_t h : full_) one_node = one_node && w_.worker_node[h] == hn;
    bool needed_away = false;
    for (int32_t wd : members_) needed_away = needed_away || w_.worker_node[wd] != hn;
    if (one_node && needed_away) node_out_[hn] += b;
  }

  RoutingBound Terms() {
    const v1::LinkModel& lm = w_.opt.link;
    const double nic = lm.nic_bytes_per_second(), nvl = lm.nvlink_bytes_per_second();
    const double hbm = lm.local_copy_bytes_per_second();
    auto nvl_of = [&](int32_t worker) { return node_size_[w_.worker_node[worker]] > 1 ? nvl : 0; };
    // A NIC carries bytes to and from other nodes only: with every worker
    // on one node, a worker's bytes move over NVLink alone.
    auto nic_of = [&](int32_t worker) {
      return node_size_[w_.worker_node[worker]] < nw_ ? nic : 0;
    };
    Max d2, d1;
    for (int32_t k = 0; k < nw_; ++k) {
      const WorkerBytes& wb = workers_[k];
      const std::string id = absl::StrCat(w_.worker_ids[k]);
      const double in_all = Over(wb.in, nic_of(k) + nvl_of(k));
      d2.Offer(std::max(in_all, wb.in_nic / nic), absl::StrCat("ingress of worker ", id));
      d1.Offer(std::max(in_all, wb.in1_nic / nic), absl::StrCat("ingress of worker ", id));
      const double copy = wb.local / hbm;
      d2.Offer(copy, absl::StrCat("local copies of worker ", id));
      d1.Offer(copy, absl::StrCat("local copies of worker ", id));
    }
    for (size_t s = 0; s < sets_.size(); ++s) {
      const std::vector<int32_t>& h = set_workers_[s];
      double cap = 0;
      for (int32_t k : h) cap += nic_of(k) + nvl_of(k);
      const double nic_cap = nic * static_cast<double>(h.size());
      std::vector<int32_t> ids;
      for (int32_t k : h) ids.push_back(w_.worker_ids[k]);
      const std::string what =
          absl::StrCat("egress of the holders {", absl::StrJoin(ids, ","), "}");
      d2.Offer(std::max(Over(sets_[s].out, cap), sets_[s].out_nic / nic_cap), what);
      d1.Offer(std::max(Over(sets_[s].out1, cap), sets_[s].out1_nic / nic_cap), what);
    }
    for (size_t n = 0; n < node_size_.size(); ++n) {
      const double cap = nic * node_size_[n];
      const std::string name = w_.node_names[n].empty() ? "(unnamed)" : w_.node_names[n];
      d2.Offer(node_in_[n] / cap, absl::StrCat("NIC ingress of node ", name));
      d2.Offer(node_out_[n] / cap, absl::StrCat("NIC egress of node ", name));
    }
    d1.Offer(d2.seconds, d2.what);  // one round moves at least what any plan moves
    RoutingBound r;
    r.data_seconds = d2.seconds;
    r.one_round_seconds = d1.seconds;
    const double lat = lm.round_latency_seconds();
    const double hop = BoundHopLatency(w_);  // a relay's hop: a round, or a step
    if (w_.cells.empty()) return r;
    if (lat + d1.seconds <= lat + hop + d2.seconds) {
      r.seconds = lat + d1.seconds;
      r.term = absl::StrCat(d1.what, ", one round");
    } else {
      r.seconds = lat + hop + d2.seconds;
      r.term = absl::StrCat(d2.what, hop < lat ? ", two steps or more" : ", two rounds or more");
    }
    return r;
  }

  const Work& w_;
  int32_t nw_;
  std::vector<WorkerBytes> workers_;
  std::vector<int32_t> node_size_;
  std::vector<double> node_in_, node_out_;
  std::vector<int32_t> node_seen_;
  std::vector<int32_t> node_members_;  // members of the cell at hand per node
  std::vector<int32_t> full_, part_, members_;
  std::vector<int32_t> part_end_;  // end of each partial group in part_
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> range_set_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> set_id_;
  std::vector<SetBytes> sets_;
  std::vector<std::vector<int32_t>> set_workers_;
};

}  // namespace

RoutingBound ComputeRoutingBound(const Work& w) { return BoundBuilder(w).Run(); }

}  // namespace wsync::plan::planner_detail
