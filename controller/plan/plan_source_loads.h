// Source choice's link bookkeeping (plan_sources.cc): the seconds every
// worker link is busy with the transfers assigned so far, the egress reserved
// for cells not assigned yet, the holders of the cell at hand, and the
// ingress target beyond which a holder hands fan-out to relays. Internal to
// the planner.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_SOURCE_LOADS_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_SOURCE_LOADS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {

inline int OutDir(LinkClass c) {
  return c == LinkClass::kLocal ? kLocalCopy : c == LinkClass::kNvlink ? kNvlOut : kNicOut;
}
inline int InDir(LinkClass c) {
  return c == LinkClass::kLocal ? kLocalCopy : c == LinkClass::kNvlink ? kNvlIn : kNicIn;
}

// The dtype a holder sends cell `c` in: block fp8 when the sender
// quantizes, the source dtype when the receiver does, else the narrower of
// the two.
inline v1::DType CellWireDType(const Cell& c, const CompiledTensor& st, const CompiledTensor& dt) {
  if (CarriesScales(c)) return v1::FP8_E4M3;
  if (c.quant == kQuantReceiver) return st.dtype;
  return WireDType(st.dtype, dt.dtype);
}

class SourceLoads {
 protected:
  explicit SourceLoads(Work* w)
      : w_(w),
        load_(w->worker_ids.size() * kNumLinkDirs, 0.0),
        reserve_(w->worker_ids.size() * kNumLinkDirs, 0.0) {}

  double& L(int32_t worker, int dir) {
    return load_[static_cast<size_t>(worker) * kNumLinkDirs + dir];
  }

  static bool Better(double cost, double out, double best, double best_out) {
    if (std::isinf(best)) return !std::isinf(cost);
    const double eps = 1e-12 * std::max(1.0, best);
    if (cost < best - eps) return true;
    if (cost > best + eps) return false;
    return out < best_out - 1e-12 * std::max(1.0, best_out);
  }

  double Seconds(LinkClass c, int64_t bytes) const { return LinkSeconds(w_->opt.link, c, bytes); }

  // Cast once, on the side that makes the wire narrower: block fp8 at the
  // sender when it holds whole blocks, else the source dtype (the receiver
  // quantizes).
  static v1::DType CellWire(const Cell& c, const CompiledTensor& st, const CompiledTensor& dt) {
    return CellWireDType(c, st, dt);
  }

  // Cells by size, largest first; counting sort on log2 size keeps it O(n).
  std::vector<int32_t> LptOrder() const;

  void GatherHolders(const Cell& c) {
    full_.clear();
    parts_.clear();
    for (int32_t i = 0; i < c.hg_count; ++i) {
      const HolderGroup& hg = w_->holder_groups[w_->cell_holders[c.hg_begin + i]];
      for (int32_t k = 0; k < hg.full_count; ++k)
        full_.push_back(w_->holder_frags[hg.full_begin + k]);
      for (int32_t k = 0; k < hg.part_count; ++k)
        parts_.push_back(w_->holder_parts[hg.part_begin + k]);
    }
  }

  // The ingress a destination worker takes at balance (each cell over its
  // best link; a cell that must cross the NIC into a node where k members
  // need it and could relay it counts 1/k for each, as it needs to enter
  // the node only once), the largest over workers: the budget beyond which
  // a holder should hand fan-out to relays.
  double IngressTarget();

  // Every cell must leave its holders at least once (split over its full
  // replicas): that egress is reserved up front so that early cells do not
  // spend a holder's budget on fan-out that relays could carry.
  void Reserve(const Cell& c, int sign);

  double Reserved(int32_t worker, int dir) const {
    return std::max(0.0, reserve_[static_cast<size_t>(worker) * kNumLinkDirs + dir]);
  }

  Work* w_;
  std::vector<double> load_;
  std::vector<double> reserve_;
  std::vector<int32_t> full_, parts_;             // the cell's full holders, partial groups
  int64_t max_in_bytes_ = 0;                      // the most bytes a worker needs (IngressTarget)
  std::vector<std::pair<int32_t, int32_t>> far_;  // IngressTarget's (node, worker) scratch
};

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_SOURCE_LOADS_H_
