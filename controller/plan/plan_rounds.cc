// Stage 8: buckets -> rounds. Every round ends at a barrier, so the cost of a
// plan is the sum over rounds of the busiest worker link in that round. The
// assignment is a greedy best fit over "units" (buckets bound together by a
// reduce, which must share a round), largest first: each unit goes to the
// round where it raises that round's maximum least, subject to the per-worker
// staging cap and to relay order (a relay bucket comes after every bucket
// that brought its data). If a unit fits nowhere, a round is appended; if the
// order constraints forbid that, the whole assignment restarts with more
// rounds.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

int32_t Find(std::vector<int32_t>& p, int32_t x) {
  while (p[x] != x) {
    p[x] = p[p[x]];
    x = p[x];
  }
  return x;
}

struct LoadEntry {
  int32_t worker;
  int32_t dir;
  double seconds;
};
struct StageEntry {
  int32_t worker;
  int64_t bytes;
};

class RoundAssigner {
 public:
  explicit RoundAssigner(Work* w) : w_(w), nw_(static_cast<int32_t>(w->worker_ids.size())) {}

  absl::Status Run() {
    BuildUnits();
    for (const StageEntry& e : stage_entries_) {
      if (e.bytes > w_->opt.staging_cap) {
        return absl::InvalidArgumentError(absl::StrCat(
            "worker ", w_->worker_ids[e.worker], " must stage ", e.bytes,
            " bytes of buckets that share a round (the contributions of one reduce or the parts "
            "of one receiver-side quantization), more than "
            "staging_cap_bytes (",
            w_->opt.staging_cap, ")"));
      }
    }
    // Relay chains need more rounds than their depth to pipeline; try a few
    // round counts and keep the cheapest (sum of round maxima + latency).
    const int32_t base = InitialRounds();
    int32_t depth = 0;
    for (int32_t d : depth_) depth = std::max(depth, d);
    std::vector<int32_t> candidates = {base, 2 * base};
    if (depth > 0) {
      for (int k : {2, 4, 8}) candidates.push_back(std::max(base, k * (depth + 1)));
    }
    // Relay-bound plans trade round latency against the tail of relays
    // behind the last round: try counts around the staging-derived one.
    if (num_units_ <= 50000) {
      for (int32_t num : {1, 3, 5, 6, 7}) {
        candidates.push_back(std::max({int32_t{1}, depth + 1, base * num / 4}));
      }
    }
    // Large plans: one candidate (the search is for small, relay-bound ones).
    if (num_units_ > 50000) candidates.resize(1);
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    double best_cost = INFINITY;
    std::vector<int32_t> best_round_of;
    int32_t best_rounds = 0;
    for (int32_t rounds : candidates) {
      for (int mode = num_units_ > 50000 ? 1 : 0; mode < 3; ++mode) {
        // Parents before children (largest first within a generation) always
        // succeeds: a child can append rounds.
        const bool placed = Place(rounds, topo_order_, mode);
        if (!placed) continue;
        if (num_units_ <= 50000) Refine();
        double cost = 0;
        for (int32_t r = 0; r < rounds_; ++r) {
          if (max_[r] > 0) cost += max_[r] + w_->opt.link.round_latency_seconds();
        }
        if (cost < best_cost * (1 - 1e-9)) {
          best_cost = cost;
          best_round_of = round_of_;
          best_rounds = rounds_;
        }
      }
    }
    if (best_round_of.empty() && num_units_ > 0) {
      return absl::InternalError("round assignment failed to converge");
    }
    round_of_ = std::move(best_round_of);
    rounds_ = best_rounds;
    return Finish();
  }

 private:
  void BuildUnits() {
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
    unit_of_.assign(nb, -1);
    for (int32_t b = 0; b < nb; ++b) {
      const int32_t r = Find(parent, b);
      if (unit_of_[r] < 0) unit_of_[r] = num_units_++;
      unit_of_[b] = unit_of_[r];
    }
    // Buckets grouped by unit (counting sort, stable in bucket order), then
    // each unit's loads aggregated per (worker, dir) in reused scratch: one
    // pass, no per-unit vectors (a Kimi-K2 plan has ~250k units).
    std::vector<int32_t> unit_start(num_units_ + 1, 0);
    for (int32_t b = 0; b < nb; ++b) ++unit_start[unit_of_[b] + 1];
    for (int32_t u = 0; u < num_units_; ++u) unit_start[u + 1] += unit_start[u];
    std::vector<int32_t> by_unit(nb);
    {
      std::vector<int32_t> next(unit_start.begin(), unit_start.end() - 1);
      for (int32_t b = 0; b < nb; ++b) by_unit[next[unit_of_[b]]++] = b;
    }
    std::vector<LoadEntry> loads;
    std::vector<StageEntry> stage;
    auto add_load = [&loads](int32_t worker, int dir, double s) {
      for (LoadEntry& e : loads) {
        if (e.worker == worker && e.dir == dir) {
          e.seconds += s;
          return;
        }
      }
      loads.push_back({worker, dir, s});
    };
    auto add_stage = [&stage](int32_t worker, int64_t bytes) {
      for (StageEntry& e : stage) {
        if (e.worker == worker) {
          e.bytes += bytes;
          return;
        }
      }
      stage.push_back({worker, bytes});
    };
    load_begin_.assign(num_units_ + 1, 0);
    stage_begin_.assign(num_units_ + 1, 0);
    weight_.assign(num_units_, 0.0);
    load_entries_.reserve(static_cast<size_t>(nb) * 2);
    stage_entries_.reserve(static_cast<size_t>(nb) * 2);
    for (int32_t u = 0; u < num_units_; ++u) {
      loads.clear();
      stage.clear();
      for (int32_t i = unit_start[u]; i < unit_start[u + 1]; ++i) {
        const BucketRec& bk = w_->buckets[by_unit[i]];
        const LinkClass l = w_->Link(bk.sender, bk.receiver);
        const double t = LinkSeconds(w_->opt.link, l, bk.bytes);
        if (l == LinkClass::kLocal) {
          add_load(bk.sender, kLocalCopy, t);
          continue;
        }
        add_load(bk.sender, l == LinkClass::kNvlink ? kNvlOut : kNicOut, t);
        add_load(bk.receiver, l == LinkClass::kNvlink ? kNvlIn : kNicIn, t);
        if (!bk.zero_copy) {
          add_stage(bk.sender, bk.bytes);
          add_stage(bk.receiver, bk.bytes);
        }
      }
      load_begin_[u + 1] = load_begin_[u] + static_cast<int32_t>(loads.size());
      stage_begin_[u + 1] = stage_begin_[u] + static_cast<int32_t>(stage.size());
      for (const LoadEntry& e : loads) {
        load_entries_.push_back(e);
        weight_[u] = std::max(weight_[u], e.seconds);
      }
      for (const StageEntry& e : stage) stage_entries_.push_back(e);
    }
    stage_total_.assign(nw_, 0);
    for (const StageEntry& e : stage_entries_) stage_total_[e.worker] += e.bytes;
    // Relay dependencies between units (parents' buckets -> child bucket).
    std::vector<std::pair<int32_t, int32_t>> edges;
    for (const Xfer& x : w_->xfers) {
      if (x.parent < 0) continue;
      const int32_t pu = unit_of_[w_->xfers[x.parent].bucket];
      const int32_t cu = unit_of_[x.bucket];
      if (pu != cu) edges.emplace_back(pu, cu);
    }
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    children_.Build(num_units_, edges, /*by_first=*/true);
    parents_.Build(num_units_, edges, /*by_first=*/false);
    // Depth (longest chain above) and height (below); units of a higher relay
    // generation only depend on lower ones, so generation order is topological.
    std::vector<int32_t> topo(num_units_);
    std::iota(topo.begin(), topo.end(), 0);
    std::vector<int32_t> gen(num_units_, 0);
    for (const Xfer& x : w_->xfers)
      gen[unit_of_[x.bucket]] = std::max<int32_t>(gen[unit_of_[x.bucket]], x.gen);
    std::stable_sort(topo.begin(), topo.end(),
                     [&](int32_t a, int32_t b) { return gen[a] < gen[b]; });
    depth_.assign(num_units_, 0);
    height_.assign(num_units_, 0);
    for (int32_t u : topo) {
      for (int32_t c : children_.of(u)) depth_[c] = std::max(depth_[c], depth_[u] + 1);
    }
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      for (int32_t p : parents_.of(*it)) height_[p] = std::max(height_[p], height_[*it] + 1);
    }
    order_.resize(num_units_);
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int32_t a, int32_t b) { return weight_[a] > weight_[b]; });
    topo_order_ = order_;
    std::stable_sort(topo_order_.begin(), topo_order_.end(),
                     [&](int32_t a, int32_t b) { return depth_[a] < depth_[b]; });
  }

  int32_t InitialRounds() const {
    int64_t peak = 0;
    for (int64_t s : stage_total_) peak = std::max(peak, s);
    int32_t depth = 0;
    for (int32_t d : depth_) depth = std::max(depth, d);
    int64_t r = (peak + w_->opt.staging_cap - 1) / w_->opt.staging_cap;
    if (r > 1) r = r + (r + 9) / 10;  // slack for packing
    return static_cast<int32_t>(std::max<int64_t>({1, r, depth + 1}));
  }

  void AddRound() {
    ++rounds_;
    load_.resize(static_cast<size_t>(rounds_) * nw_ * kNumLinkDirs, 0.0);
    staged_.resize(static_cast<size_t>(rounds_) * nw_, 0);
    max_.push_back(0.0);
  }

  // mode 0: best fit (the round whose maximum grows least, then the least
  // loaded); mode 1: worst fit (the round where the unit's busiest link ends
  // lowest), which spreads every worker evenly over the rounds; mode 2: first
  // fit (the earliest round whose maximum does not grow, else best fit), which
  // keeps relay chains close behind the data they forward.
  bool Place(int32_t rounds, const std::vector<int32_t>& order, int mode) {
    rounds_ = 0;
    load_.clear();
    staged_.clear();
    max_.clear();
    for (int32_t r = 0; r < rounds; ++r) AddRound();
    round_of_.assign(num_units_, -1);
    lo_ = depth_;
    hi_fix_.assign(num_units_, INT32_MAX);
    const int64_t cap = w_->opt.staging_cap;
    for (int32_t u : order) {
      const int32_t lo = lo_[u];
      int32_t hi = std::min(rounds_ - 1 - height_[u], hi_fix_[u]);
      int32_t best = -1;
      double best_inc = INFINITY, best_max = INFINITY;
      for (int32_t r = lo; r <= hi; ++r) {
        bool fits = true;
        for (int32_t i = stage_begin_[u]; i < stage_begin_[u + 1] && fits; ++i) {
          const StageEntry& e = stage_entries_[i];
          if (staged_[static_cast<size_t>(r) * nw_ + e.worker] + e.bytes > cap) fits = false;
        }
        if (!fits) continue;
        double m = 0;
        for (int32_t i = load_begin_[u]; i < load_begin_[u + 1]; ++i) {
          const LoadEntry& e = load_entries_[i];
          m = std::max(m, LoadAt(r, e.worker, e.dir) + e.seconds);
        }
        const double inc = mode != 1 ? std::max(0.0, m - max_[r]) : 0.0;
        if (mode == 2 && inc <= 1e-15) {
          best = r;
          break;
        }
        if (inc < best_inc - 1e-15 || (inc <= best_inc + 1e-15 && m < best_max)) {
          best = r;
          best_inc = inc;
          best_max = m;
        }
      }
      if (best < 0) {
        if (hi_fix_[u] != INT32_MAX) return false;
        AddRound();
        best = rounds_ - 1;
        if (best < lo) return false;
      }
      Commit(u, best);
    }
    return true;
  }

  // Local search after a greedy placement: repeatedly take the costliest
  // round's critical link and move units that load it to rounds where they
  // raise nothing (staging cap and relay order kept). Every move leaves the
  // other rounds' maxima as they were, so the sum of maxima never grows.
  void Refine() {
    std::vector<std::vector<int32_t>> in_round(rounds_);
    for (int32_t u = 0; u < num_units_; ++u) in_round[round_of_[u]].push_back(u);
    std::vector<int32_t> by_max(rounds_);
    for (int pass = 0; pass < 4; ++pass) {
      bool moved = false;
      std::iota(by_max.begin(), by_max.end(), 0);
      std::stable_sort(by_max.begin(), by_max.end(),
                       [&](int32_t a, int32_t b) { return max_[a] > max_[b]; });
      for (int32_t r : by_max) {
        // Moves out of r until its critical link has no movable unit left.
        for (bool again = true; again;) {
          again = false;
          int32_t cw = 0, cd = 0;
          for (int32_t wk = 0; wk < nw_; ++wk) {
            for (int d = 0; d < kNumLinkDirs; ++d) {
              if (LoadAt(r, wk, d) > LoadAt(r, cw, cd)) cw = wk, cd = d;
            }
          }
          std::vector<int32_t>& units = in_round[r];
          for (size_t k = 0; k < units.size(); ++k) {
            const int32_t u = units[k];
            bool critical = false;
            for (int32_t i = load_begin_[u]; i < load_begin_[u + 1] && !critical; ++i) {
              critical = load_entries_[i].worker == cw && load_entries_[i].dir == cd;
            }
            if (!critical) continue;
            const int32_t to = NoGrowthRound(u, r);
            if (to < 0) continue;
            Move(u, r, to);
            units[k] = units.back();
            units.pop_back();
            in_round[to].push_back(u);
            moved = again = true;
            break;
          }
        }
      }
      if (!moved) break;
    }
  }

  // A round other than `from` that takes unit u without its maximum growing
  // (the one where u's busiest link ends lowest), or -1.
  int32_t NoGrowthRound(int32_t u, int32_t from) {
    int32_t lo = 0, hi = rounds_ - 1;
    for (int32_t p : parents_.of(u)) lo = std::max(lo, round_of_[p] + 1);
    for (int32_t c : children_.of(u)) hi = std::min(hi, round_of_[c] - 1);
    int32_t best = -1;
    double best_m = INFINITY;
    for (int32_t r = lo; r <= hi; ++r) {
      if (r == from) continue;
      double m = 0;
      for (int32_t i = load_begin_[u]; i < load_begin_[u + 1]; ++i) {
        const LoadEntry& e = load_entries_[i];
        m = std::max(m, LoadAt(r, e.worker, e.dir) + e.seconds);
      }
      if (m > max_[r] * (1 + 1e-12) || m >= best_m) continue;
      bool fits = true;
      for (int32_t i = stage_begin_[u]; i < stage_begin_[u + 1] && fits; ++i) {
        const StageEntry& e = stage_entries_[i];
        fits = staged_[static_cast<size_t>(r) * nw_ + e.worker] + e.bytes <= w_->opt.staging_cap;
      }
      if (!fits) continue;
      best = r;
      best_m = m;
    }
    return best;
  }

  void Move(int32_t u, int32_t from, int32_t to) {
    for (int32_t i = load_begin_[u]; i < load_begin_[u + 1]; ++i) {
      const LoadEntry& e = load_entries_[i];
      LoadAt(from, e.worker, e.dir) -= e.seconds;
      double& l = LoadAt(to, e.worker, e.dir);
      l += e.seconds;
      max_[to] = std::max(max_[to], l);
    }
    for (int32_t i = stage_begin_[u]; i < stage_begin_[u + 1]; ++i) {
      const StageEntry& e = stage_entries_[i];
      staged_[static_cast<size_t>(from) * nw_ + e.worker] -= e.bytes;
      staged_[static_cast<size_t>(to) * nw_ + e.worker] += e.bytes;
    }
    round_of_[u] = to;
    double m = 0;
    for (int32_t wk = 0; wk < nw_; ++wk) {
      for (int d = 0; d < kNumLinkDirs; ++d) m = std::max(m, LoadAt(from, wk, d));
    }
    max_[from] = m;
  }

  double& LoadAt(int32_t r, int32_t worker, int dir) {
    return load_[(static_cast<size_t>(r) * nw_ + worker) * kNumLinkDirs + dir];
  }

  void Commit(int32_t u, int32_t r) {
    round_of_[u] = r;
    for (int32_t i = load_begin_[u]; i < load_begin_[u + 1]; ++i) {
      const LoadEntry& e = load_entries_[i];
      double& l = LoadAt(r, e.worker, e.dir);
      l += e.seconds;
      max_[r] = std::max(max_[r], l);
    }
    for (int32_t i = stage_begin_[u]; i < stage_begin_[u + 1]; ++i) {
      staged_[static_cast<size_t>(r) * nw_ + stage_entries_[i].worker] += stage_entries_[i].bytes;
    }
    // Propagate order constraints to unplaced relatives.
    std::vector<std::pair<int32_t, int32_t>> stack;
    for (int32_t c : children_.of(u)) stack.emplace_back(c, r + 1);
    while (!stack.empty()) {
      auto [v, lo] = stack.back();
      stack.pop_back();
      if (lo <= lo_[v]) continue;
      lo_[v] = lo;
      for (int32_t c : children_.of(v)) stack.emplace_back(c, lo + 1);
    }
    for (int32_t p : parents_.of(u)) stack.emplace_back(p, r - 1);
    while (!stack.empty()) {
      auto [v, hi] = stack.back();
      stack.pop_back();
      if (hi >= hi_fix_[v]) continue;
      hi_fix_[v] = hi;
      for (int32_t p : parents_.of(v)) stack.emplace_back(p, hi - 1);
    }
  }

  absl::Status Finish() {
    // Drop empty rounds, keeping order.
    std::vector<int32_t> used(rounds_, 0), remap(rounds_, -1);
    for (int32_t u = 0; u < num_units_; ++u) used[round_of_[u]] = 1;
    int32_t n = 0;
    for (int32_t r = 0; r < rounds_; ++r) {
      if (used[r]) remap[r] = n++;
    }
    for (size_t b = 0; b < w_->buckets.size(); ++b) {
      w_->buckets[b].round = remap[round_of_[unit_of_[b]]];
    }
    for (const Xfer& x : w_->xfers) {
      if (x.reduce != 0) w_->reduces[x.reduce - 1].round = w_->buckets[x.bucket].round;
      if (x.quantize != 0) w_->quants[x.quantize - 1].round = w_->buckets[x.bucket].round;
    }
    w_->num_rounds = n;
    return absl::OkStatus();
  }

  Work* w_;
  int32_t nw_;
  int32_t num_units_ = 0;
  std::vector<int32_t> unit_of_;
  std::vector<LoadEntry> load_entries_;
  std::vector<StageEntry> stage_entries_;
  std::vector<int32_t> load_begin_, stage_begin_;
  std::vector<double> weight_;
  std::vector<int64_t> stage_total_;
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
  UnitLists children_, parents_;
  std::vector<int32_t> depth_, height_, order_, topo_order_;
  // Assignment state.
  int32_t rounds_ = 0;
  std::vector<double> load_;
  std::vector<int64_t> staged_;
  std::vector<double> max_;
  std::vector<int32_t> round_of_, lo_, hi_fix_;
};

}  // namespace

absl::Status AssignRounds(Work* w) {
  if (w->buckets.empty()) {
    w->num_rounds = 0;
    return absl::OkStatus();
  }
  for (const BucketRec& b : w->buckets) {
    if (!b.local && !b.zero_copy && b.bytes > w->opt.staging_cap) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a bucket of ", b.bytes, " bytes from worker ", w->worker_ids[b.sender], " to worker ",
          w->worker_ids[b.receiver], " exceeds staging_cap_bytes (", w->opt.staging_cap, ")"));
    }
  }
  return RoundAssigner(w).Run();
}

}  // namespace wsync::plan::planner_detail
