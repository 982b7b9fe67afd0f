// The units of round assignment (plan_units.h).
#include "controller/plan/plan_units.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_map.h"

namespace wsync::plan::planner_detail {
namespace {

int32_t Find(std::vector<int32_t>& p, int32_t x) {
  while (p[x] != x) {
    p[x] = p[p[x]];
    x = p[x];
  }
  return x;
}

class UnitBuilder {
 public:
  explicit UnitBuilder(const Work& w) : w_(&w), nw_(static_cast<int32_t>(w.worker_ids.size())) {}

  RoundUnits Build() {
    BuildUnits();
    return std::move(u_);
  }

 private:
  void BuildUnits() {
    UniteBuckets();
    // Buckets grouped by unit (counting sort, stable in bucket order), then
    // each unit's loads aggregated per (worker, dir) in reused scratch: one
    // pass, no per-unit vectors (a plan may have ~250k units).
    const int32_t nb = static_cast<int32_t>(w_->buckets.size());
    std::vector<int32_t> unit_start(u_.num_units + 1, 0);
    for (int32_t b = 0; b < nb; ++b) ++unit_start[u_.unit_of[b] + 1];
    for (int32_t u = 0; u < u_.num_units; ++u) unit_start[u + 1] += unit_start[u];
    std::vector<int32_t> by_unit(nb);
    {
      std::vector<int32_t> next(unit_start.begin(), unit_start.end() - 1);
      for (int32_t b = 0; b < nb; ++b) by_unit[next[u_.unit_of[b]]++] = b;
    }
    AggregateUnitLoads(unit_start, by_unit);
    NumberPairs(unit_start, by_unit);
    BuildRelayGraph();
    OrderUnits();
  }

  // Units: buckets bound together by a reduce or a receiver-side
  // quantization (their inputs share a round), numbered in bucket order.
  void UniteBuckets() {
    const int32_t nb = static_cast<int32_t>(w_->buckets.size());
    std::vector<int32_t> parent(nb);
    std::iota(parent.begin(), parent.end(), 0);
    std::vector<int32_t> first(w_->reduces.size() + 1, -1);
    std::vector<int32_t> first_q(w_->quants.size() + 1, -1);
    for (const Xfer& x : w_->xfers) {
      if (x.reduce == 0 && x.quantize == 0) continue;
      int32_t& f = x.reduce != 0 ? first[x.reduce] : first_q[x.quantize];
      if (f < 0) {
        f = x.bucket;
      } else {
        parent[Find(parent, x.bucket)] = Find(parent, f);
      }
    }
    u_.unit_of.assign(nb, -1);
    for (int32_t b = 0; b < nb; ++b) {
      const int32_t r = Find(parent, b);
      if (u_.unit_of[r] < 0) u_.unit_of[r] = u_.num_units++;
      u_.unit_of[b] = u_.unit_of[r];
    }
  }

  // Per unit (its buckets by_unit[unit_start[u]..unit_start[u + 1])): link
  // seconds per (worker, dir), staged bytes per worker, and its weight (its
  // busiest link); per worker, the staged bytes of all units.
  void AggregateUnitLoads(const std::vector<int32_t>& unit_start,
                          const std::vector<int32_t>& by_unit) {
    std::vector<LoadEntry> loads;
    std::vector<StageEntry> stage;
    u_.load_begin.assign(u_.num_units + 1, 0);
    u_.stage_begin.assign(u_.num_units + 1, 0);
    u_.weight.assign(u_.num_units, 0.0);
    u_.load_entries.reserve(by_unit.size() * 2);
    u_.stage_entries.reserve(by_unit.size() * 2);
    for (int32_t u = 0; u < u_.num_units; ++u) {
      loads.clear();
      stage.clear();
      for (int32_t i = unit_start[u]; i < unit_start[u + 1]; ++i) {
        AddBucketLoads(w_->buckets[by_unit[i]], &loads, &stage);
      }
      u_.load_begin[u + 1] = u_.load_begin[u] + static_cast<int32_t>(loads.size());
      u_.stage_begin[u + 1] = u_.stage_begin[u] + static_cast<int32_t>(stage.size());
      for (const LoadEntry& e : loads) {
        u_.load_entries.push_back(e);
        u_.weight[u] = std::max(u_.weight[u], e.seconds);
      }
      for (const StageEntry& e : stage) u_.stage_entries.push_back(e);
    }
    u_.stage_total.assign(nw_, 0);
    for (const StageEntry& e : u_.stage_entries) u_.stage_total[e.worker] += e.bytes;
  }

  // Adds bucket bk's link seconds to `loads` and its staged bytes (both
  // ends, unless local or zero-copy) to `stage`, merging per (worker, dir).
  void AddBucketLoads(const BucketRec& bk, std::vector<LoadEntry>* loads,
                      std::vector<StageEntry>* stage) const {
    auto add_load = [loads](int32_t worker, int dir, double s) {
      for (LoadEntry& e : *loads) {
        if (e.worker == worker && e.dir == dir) {
          e.seconds += s;
          return;
        }
      }
      loads->push_back({worker, dir, s});
    };
    auto add_stage = [stage](int32_t worker, int64_t bytes) {
      for (StageEntry& e : *stage) {
        if (e.worker == worker) {
          e.bytes += bytes;
          return;
        }
      }
      stage->push_back({worker, bytes});
    };
    const LinkClass l = w_->Link(bk.sender, bk.receiver);
    const double t = LinkSeconds(w_->opt.link, l, bk.bytes);
    if (l == LinkClass::kLocal) {
      add_load(bk.sender, kLocalCopy, t);
      return;
    }
    add_load(bk.sender, l == LinkClass::kNvlink ? kNvlOut : kNicOut, t);
    add_load(bk.receiver, l == LinkClass::kNvlink ? kNvlIn : kNicIn, t);
    if (!bk.zero_copy) {
      add_stage(bk.sender, bk.bytes);
      add_stage(bk.receiver, bk.bytes);
    }
  }

  // Per unit: its rank among the units whose first bucket links the same
  // (sender, receiver) pair.
  void NumberPairs(const std::vector<int32_t>& unit_start, const std::vector<int32_t>& by_unit) {
    absl::flat_hash_map<int64_t, int32_t> seen;
    u_.pair_ordinal.assign(u_.num_units, 0);
    for (int32_t u = 0; u < u_.num_units; ++u) {
      const BucketRec& b = w_->buckets[by_unit[unit_start[u]]];
      u_.pair_ordinal[u] = seen[static_cast<int64_t>(b.sender) * nw_ + b.receiver]++;
    }
  }

  // Relay dependencies between units (parents' buckets -> child bucket).
  void BuildRelayGraph() {
    std::vector<std::pair<int32_t, int32_t>> edges;
    for (const Xfer& x : w_->xfers) {
      if (x.parent < 0) continue;
      const int32_t pu = u_.unit_of[w_->xfers[x.parent].bucket];
      const int32_t cu = u_.unit_of[x.bucket];
      if (pu != cu) edges.emplace_back(pu, cu);
    }
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    u_.children.Build(u_.num_units, edges, /*by_first=*/true);
    u_.parents.Build(u_.num_units, edges, /*by_first=*/false);
  }

  // Depth (longest chain above) and height (below) of every unit; units by
  // weight (u_.order) and by depth, then weight (u_.topo_order). Units of a
  // higher relay generation only depend on lower ones, so generation order
  // is topological.
  void OrderUnits() {
    std::vector<int32_t> topo(u_.num_units);
    std::iota(topo.begin(), topo.end(), 0);
    std::vector<int32_t> gen(u_.num_units, 0);
    for (const Xfer& x : w_->xfers)
      gen[u_.unit_of[x.bucket]] = std::max<int32_t>(gen[u_.unit_of[x.bucket]], x.gen);
    std::stable_sort(topo.begin(), topo.end(),
                     [&](int32_t a, int32_t b) { return gen[a] < gen[b]; });
    u_.depth.assign(u_.num_units, 0);
    u_.height.assign(u_.num_units, 0);
    for (int32_t u : topo) {
      for (int32_t c : u_.children.of(u)) u_.depth[c] = std::max(u_.depth[c], u_.depth[u] + 1);
    }
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      for (int32_t p : u_.parents.of(*it))
        u_.height[p] = std::max(u_.height[p], u_.height[*it] + 1);
    }
    u_.order.resize(u_.num_units);
    std::iota(u_.order.begin(), u_.order.end(), 0);
    std::stable_sort(u_.order.begin(), u_.order.end(),
                     [&](int32_t a, int32_t b) { return u_.weight[a] > u_.weight[b]; });
    u_.topo_order = u_.order;
    std::stable_sort(u_.topo_order.begin(), u_.topo_order.end(),
                     [&](int32_t a, int32_t b) { return u_.depth[a] < u_.depth[b]; });
  }

  const Work* w_;
  int32_t nw_;
  RoundUnits u_;
};

}  // namespace

RoundUnits BuildRoundUnits(const Work& w) { return UnitBuilder(w).Build(); }

}  // namespace wsync::plan::planner_detail
