// Stage 8's input (plan_rounds.cc): the units of round assignment. A unit is
// a set of buckets that must share a round (the contributions of one reduce,
// the parts of one receiver-side quantization), with its link load per
// (worker, direction), its staged bytes per worker, and the relay
// dependencies between units. Internal to the planner.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_UNITS_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_UNITS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {

struct LoadEntry {
  int32_t worker;
  int32_t dir;  // LinkDir
  double seconds;
};
struct StageEntry {
  int32_t worker;
  int64_t bytes;
};

// Per unit lists stored flat (CSR): ~250k units, few with relay edges.
struct UnitLists {
  struct Range {
    const int32_t* b;
    const int32_t* e;
    const int32_t* begin() const { return b; }
    const int32_t* end() const { return e; }
  };
  std::vector<int32_t> start, items;
  // From sorted, unique (parent, child) edges: children of each parent
  // (by_first) or parents of each child, each list in edge order.
  void Build(int32_t n, const std::vector<std::pair<int32_t, int32_t>>& edges, bool by_first) {
    start.assign(n + 1, 0);
    for (const auto& e : edges) ++start[(by_first ? e.first : e.second) + 1];
    for (int32_t u = 0; u < n; ++u) start[u + 1] += start[u];
    items.resize(edges.size());
    std::vector<int32_t> next(start.begin(), start.end() - 1);
    for (const auto& e : edges) {
      items[next[by_first ? e.first : e.second]++] = by_first ? e.second : e.first;
    }
  }
  Range of(int32_t u) const { return {items.data() + start[u], items.data() + start[u + 1]}; }
};

struct RoundUnits {
  int32_t num_units = 0;
  std::vector<int32_t> unit_of;  // per bucket
  // Unit u's loads are load_entries[load_begin[u], load_begin[u + 1]), its
  // staged bytes stage_entries[stage_begin[u], stage_begin[u + 1]).
  std::vector<LoadEntry> load_entries;
  std::vector<StageEntry> stage_entries;
  std::vector<int32_t> load_begin, stage_begin;
  std::vector<double> weight;        // per unit: its busiest link's seconds
  std::vector<int64_t> stage_total;  // per worker: staged bytes of all units
  UnitLists children, parents;       // relay dependencies
  // Per unit: the longest relay chain above it and below it.
  std::vector<int32_t> depth, height;
  // Per unit: how many units before it (in unit order) have a first bucket
  // with the same sender and receiver as its own.
  std::vector<int32_t> pair_ordinal;
  // Units by weight (heaviest first), and by depth, then weight.
  std::vector<int32_t> order, topo_order;
};

// The units of w's buckets (after PackBuckets).
RoundUnits BuildRoundUnits(const Work& w);

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_UNITS_H_
