// Stage 8: buckets -> rounds. Every round ends at a barrier, so the cost of a
// plan is the sum over rounds of the busiest worker link in that round. Units
// (buckets bound together by a reduce, which must share a round) are
// assigned to rounds subject to the per-worker staging cap and to relay
// order (a relay bucket comes after every bucket that brought its data), in
// several ways (Mode below) and for a few round counts; the cheapest
// assignment is kept. The greedy fits go unit by unit, largest first; if a
// unit fits nowhere, a round is appended, and if the order constraints
// forbid that, that try is dropped.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "controller/plan/plan_cost.h"
#include "controller/plan/plan_round_list.h"
#include "controller/plan/plan_units.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// Ways to assign units to rounds; each one Modes() lists is tried and the
// cheapest assignment kept.
//  * kBestFit: unit by unit, the round whose maximum grows least, then the
//    least loaded;
//  * kWorstFit: the round where the unit's busiest link ends lowest, which
//    spreads every worker evenly over the rounds;
//  * kFirstFit: the earliest round whose maximum does not grow, else best
//    fit, which keeps relay chains close behind the data they forward;
//  * kTimeOrder: rounds filled one after the other (plan_round_list.h), which
//    overlaps sources' sends with the relays behind them.
enum Mode { kBestFit, kWorstFit, kFirstFit, kTimeOrder };

// Plans of more units try one round count, without best fit (its cost grows
// with units x rounds), first fit (never the cheapest there, on the catalog)
// and the local search; they stop at the first assignment within 1 % of the
// floor (Run), trying time order first where most units are relays.
constexpr int32_t kLargePlanUnits = 50000;

class RoundAssigner {
 public:
  explicit RoundAssigner(Work* w)
      : w_(w),
        nw_(static_cast<int32_t>(w->worker_ids.size())),
        units_(BuildRoundUnits(*w)),
        busiest_link_total_(BusiestLinkTotal(units_, nw_)) {}

  absl::Status Run() {
    for (const StageEntry& e : units_.stage_entries) {
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
    // round counts and keep the cheapest (sum of round maxima + latency; a
    // step's where rounds become steps, AssignSteps).
    const std::vector<int32_t> candidates = RoundCandidates();
    // Large plans stop at an assignment within 1 % of what no assignment
    // beats (the busiest link's total plus a latency per round the staging
    // cap and the relay depth force): the others could gain at most that.
    const double good_enough = units_.num_units > kLargePlanUnits
                                   ? 1.01 * (busiest_link_total_ + MinRounds() * w_->hop_latency)
                                   : 0.0;
    double best_cost = INFINITY;
    std::vector<int32_t> best_round_of;
    int32_t best_rounds = 0;
    for (int32_t rounds : candidates) {
      if (best_cost <= good_enough) break;
      for (Mode mode : Modes()) {
        if (best_cost <= good_enough) break;
        // Parents before children (largest first within a generation) always
        // succeeds: a child can append rounds.
        const bool placed =
            mode == kTimeOrder ? PlaceInTimeOrder(rounds) : Place(rounds, units_.topo_order, mode);
        if (!placed) continue;
        if (units_.num_units <= kLargePlanUnits) Refine();
        double cost = 0;
        for (int32_t r = 0; r < rounds_; ++r) {
          if (max_[r] > 0) cost += max_[r] + w_->hop_latency;
        }
        if (cost < best_cost * (1 - 1e-9)) {
          best_cost = cost;
          best_round_of = round_of_;
          best_rounds = rounds_;
        }
      }
    }
    if (best_round_of.empty() && units_.num_units > 0) {
      return absl::InternalError("round assignment failed to converge");
    }
    round_of_ = std::move(best_round_of);
    rounds_ = best_rounds;
    return Finish();
  }

  std::vector<Mode> Modes() const {
    if (units_.num_units > kLargePlanUnits) {
      // Mostly relays (FSDP2 shards fanned out to replicas): time order
      // first, as it tends to win there; else worst fit first.
      int64_t relays = 0;
      for (int32_t d : units_.depth) relays += d > 0;
      if (2 * relays > units_.num_units) return {kTimeOrder, kWorstFit};
      return {kWorstFit, kTimeOrder};
    }
    return {kBestFit, kWorstFit, kFirstFit, kTimeOrder};
  }

  // Round counts to try, ascending: the staging-derived one, twice it, and
  // for relay chains multiples of their depth; small plans also counts
  // around the staging-derived one and around the pipeline's optimum
  // (PipelineRounds): relay-bound plans trade round latency against the tail
  // of relays behind the last round. Large plans try the staging-derived
  // one only (the search is for small, relay-bound ones).
  std::vector<int32_t> RoundCandidates() const {
    const int32_t base = InitialRounds();
    const int32_t depth = MaxDepth();
    std::vector<int32_t> candidates = {base, 2 * base};
    if (depth > 0) {
      for (int k : {2, 4, 8}) candidates.push_back(std::max(base, k * (depth + 1)));
      // Small relay-bound plans (fanned-out chunks): finer steps.
      if (units_.num_units <= kLargePlanUnits) {
        for (int k : {3, 6, 12}) candidates.push_back(std::max(base, k * (depth + 1)));
      }
    }
    if (units_.num_units <= kLargePlanUnits) {
      for (int32_t num : {1, 3, 5, 6, 7}) {
        candidates.push_back(std::max({int32_t{1}, depth + 1, base * num / 4}));
      }
      for (double f : {0.7, 1.0, 1.4}) {
        const int32_t r = PipelineRounds(f);
        if (r > 0) candidates.push_back(std::max(base, r));
      }
    }
    if (units_.num_units > kLargePlanUnits) candidates.resize(1);
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    return candidates;
  }

 private:
  // PipelineRoundCount (plan_cost.h) for the busiest link's total, times f,
  // at most kMaxPipelineRounds (an assignment keeps rounds x workers loads);
  // 0 without relays or latency.
  int32_t PipelineRounds(double f) const {
    const double r = f * PipelineRoundCount(MaxDepth(), busiest_link_total_, w_->hop_latency);
    if (!(r > 0)) return 0;
    return r >= kMaxPipelineRounds ? kMaxPipelineRounds : static_cast<int32_t>(std::lround(r));
  }

  // Rounds the busiest worker's staged bytes need under the staging cap.
  int64_t StagingRounds() const {
    int64_t peak = 0;
    for (int64_t s : units_.stage_total) peak = std::max(peak, s);
    const int64_t cap = w_->opt.staging_cap;
    return peak / cap + (peak % cap != 0);  // no overflow near INT64_MAX
  }

  int32_t MaxDepth() const {
    int32_t depth = 0;
    for (int32_t d : units_.depth) depth = std::max(depth, d);
    return depth;
  }

  // The rounds no assignment does without: the staging rounds, and the
  // longest relay chain.
  int64_t MinRounds() const { return std::max<int64_t>({1, StagingRounds(), MaxDepth() + 1}); }

  // The staging rounds with 10 % slack for packing, at least the depth's.
  int32_t InitialRounds() const {
    int64_t r = StagingRounds();
    if (r > 1) r = r + (r + 9) / 10;
    return static_cast<int32_t>(std::max<int64_t>({1, r, MaxDepth() + 1}));
  }

  void AddRound() {
    ++rounds_;
    load_.resize(static_cast<size_t>(rounds_) * nw_ * kNumLinkDirs, 0.0);
    staged_.resize(static_cast<size_t>(rounds_) * nw_, 0);
    max_.push_back(0.0);
  }

  void Reset(int32_t rounds) {
    rounds_ = 0;
    load_.clear();
    staged_.clear();
    max_.clear();
    for (int32_t r = 0; r < rounds; ++r) AddRound();
    round_of_.assign(units_.num_units, -1);
    lo_ = units_.depth;
    hi_fix_.assign(units_.num_units, INT32_MAX);
  }

  // Greedy fits, unit by unit in `order` (mode: kBestFit, kWorstFit or
  // kFirstFit).
  bool Place(int32_t rounds, const std::vector<int32_t>& order, Mode mode) {
    Reset(rounds);
    const int64_t cap = w_->opt.staging_cap;
    for (int32_t u : order) {
      const int32_t lo = lo_[u];
      int32_t hi = std::min(rounds_ - 1 - units_.height[u], hi_fix_[u]);
      int32_t best = -1;
      double best_inc = INFINITY, best_max = INFINITY;
      // Best and worst fit look at every round: their fits and maxima are
      // computed entry by entry over all rounds at once (independent chains
      // instead of one chain per round; the same values).
      const bool all_rounds = mode != kFirstFit && hi >= lo;
      if (all_rounds) RoundMaxima(u, lo, hi, cap);
      for (int32_t r = lo; r <= hi; ++r) {
        double m = 0;
        if (all_rounds) {
          if (!cand_fit_[r - lo]) continue;
          m = cand_max_[r - lo];
        } else {
          bool fits = true;
          for (int32_t i = units_.stage_begin[u]; i < units_.stage_begin[u + 1] && fits; ++i) {
            const StageEntry& e = units_.stage_entries[i];
            if (staged_[static_cast<size_t>(r) * nw_ + e.worker] + e.bytes > cap) fits = false;
          }
          if (!fits) continue;
          for (int32_t i = units_.load_begin[u]; i < units_.load_begin[u + 1]; ++i) {
            const LoadEntry& e = units_.load_entries[i];
            m = std::max(m, LoadAt(r, e.worker, e.dir) + e.seconds);
          }
        }
        const double inc = mode != kWorstFit ? std::max(0.0, m - max_[r]) : 0.0;
        if (mode == kFirstFit && inc <= 1e-15) {
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

  // kTimeOrder: list scheduling (plan_round_list.h), rounds as long as
  // `rounds` equal rounds of the busiest link would be.
  bool PlaceInTimeOrder(int32_t rounds) {
    const double tau = busiest_link_total_ / rounds;
    const std::vector<int32_t> round_of = ListScheduleRounds(units_, nw_, w_->opt.staging_cap, tau);
    Reset(0);
    for (int32_t u = 0; u < units_.num_units; ++u) {
      while (round_of[u] >= rounds_) AddRound();
      AddLoads(u, round_of[u]);
    }
    return true;
  }

  // Local search after a greedy placement: repeatedly take the costliest
  // round's critical link and move units that load it to rounds where they
  // raise nothing (staging cap and relay order kept). Every move leaves the
  // other rounds' maxima as they were, so the sum of maxima never grows.
  void Refine() {
    std::vector<std::vector<int32_t>> in_round(rounds_);
    for (int32_t u = 0; u < units_.num_units; ++u) in_round[round_of_[u]].push_back(u);
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
            for (int32_t i = units_.load_begin[u]; i < units_.load_begin[u + 1] && !critical; ++i) {
              critical = units_.load_entries[i].worker == cw && units_.load_entries[i].dir == cd;
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
    for (int32_t p : units_.parents.of(u)) lo = std::max(lo, round_of_[p] + 1);
    for (int32_t c : units_.children.of(u)) hi = std::min(hi, round_of_[c] - 1);
    int32_t best = -1;
    double best_m = INFINITY;
    for (int32_t r = lo; r <= hi; ++r) {
      if (r == from) continue;
      double m = 0;
      for (int32_t i = units_.load_begin[u]; i < units_.load_begin[u + 1]; ++i) {
        const LoadEntry& e = units_.load_entries[i];
        m = std::max(m, LoadAt(r, e.worker, e.dir) + e.seconds);
      }
      if (m > max_[r] * (1 + 1e-12) || m >= best_m) continue;
      bool fits = true;
      for (int32_t i = units_.stage_begin[u]; i < units_.stage_begin[u + 1] && fits; ++i) {
        const StageEntry& e = units_.stage_entries[i];
        fits = staged_[static_cast<size_t>(r) * nw_ + e.worker] + e.bytes <= w_->opt.staging_cap;
      }
      if (!fits) continue;
      best = r;
      best_m = m;
    }
    return best;
  }

  void Move(int32_t u, int32_t from, int32_t to) {
    for (int32_t i = units_.load_begin[u]; i < units_.load_begin[u + 1]; ++i) {
      const LoadEntry& e = units_.load_entries[i];
      LoadAt(from, e.worker, e.dir) -= e.seconds;
      double& l = LoadAt(to, e.worker, e.dir);
      l += e.seconds;
      max_[to] = std::max(max_[to], l);
    }
    for (int32_t i = units_.stage_begin[u]; i < units_.stage_begin[u + 1]; ++i) {
      const StageEntry& e = units_.stage_entries[i];
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

  // For rounds lo..hi: whether unit u's staging fits (cand_fit_) and the
  // busiest of its links with it added (cand_max_), indexed from lo.
  void RoundMaxima(int32_t u, int32_t lo, int32_t hi, int64_t cap) {
    const int32_t n = hi - lo + 1;
    cand_fit_.assign(n, 1);
    cand_max_.assign(n, 0.0);
    for (int32_t i = units_.stage_begin[u]; i < units_.stage_begin[u + 1]; ++i) {
      const StageEntry& e = units_.stage_entries[i];
      for (int32_t k = 0; k < n; ++k) {
        if (staged_[static_cast<size_t>(lo + k) * nw_ + e.worker] + e.bytes > cap) {
          cand_fit_[k] = 0;
        }
      }
    }
    const size_t stride = static_cast<size_t>(nw_) * kNumLinkDirs;
    for (int32_t i = units_.load_begin[u]; i < units_.load_begin[u + 1]; ++i) {
      const LoadEntry& e = units_.load_entries[i];
      const double* load = &LoadAt(lo, e.worker, e.dir);
      for (int32_t k = 0; k < n; ++k) {
        cand_max_[k] = std::max(cand_max_[k], load[k * stride] + e.seconds);
      }
    }
  }

  double& LoadAt(int32_t r, int32_t worker, int dir) {
    return load_[(static_cast<size_t>(r) * nw_ + worker) * kNumLinkDirs + dir];
  }

  void Commit(int32_t u, int32_t r) {
    AddLoads(u, r);
    PropagateOrder(u, r);
  }

  void AddLoads(int32_t u, int32_t r) {
    round_of_[u] = r;
    for (int32_t i = units_.load_begin[u]; i < units_.load_begin[u + 1]; ++i) {
      const LoadEntry& e = units_.load_entries[i];
      double& l = LoadAt(r, e.worker, e.dir);
      l += e.seconds;
      max_[r] = std::max(max_[r], l);
    }
    for (int32_t i = units_.stage_begin[u]; i < units_.stage_begin[u + 1]; ++i) {
      staged_[static_cast<size_t>(r) * nw_ + units_.stage_entries[i].worker] +=
          units_.stage_entries[i].bytes;
    }
  }

  // Propagates order constraints to unplaced relatives of u, placed in r.
  void PropagateOrder(int32_t u, int32_t r) {
    std::vector<std::pair<int32_t, int32_t>> stack;
    for (int32_t c : units_.children.of(u)) stack.emplace_back(c, r + 1);
    while (!stack.empty()) {
      auto [v, lo] = stack.back();
      stack.pop_back();
      if (lo <= lo_[v]) continue;
      lo_[v] = lo;
      for (int32_t c : units_.children.of(v)) stack.emplace_back(c, lo + 1);
    }
    for (int32_t p : units_.parents.of(u)) stack.emplace_back(p, r - 1);
    while (!stack.empty()) {
      auto [v, hi] = stack.back();
      stack.pop_back();
      if (hi >= hi_fix_[v]) continue;
      hi_fix_[v] = hi;
      for (int32_t p : units_.parents.of(v)) stack.emplace_back(p, hi - 1);
    }
  }

  absl::Status Finish() {
    // Drop empty rounds, keeping order.
    std::vector<int32_t> used(rounds_, 0), remap(rounds_, -1);
    for (int32_t u = 0; u < units_.num_units; ++u) used[round_of_[u]] = 1;
    int32_t n = 0;
    for (int32_t r = 0; r < rounds_; ++r) {
      if (used[r]) remap[r] = n++;
    }
    for (size_t b = 0; b < w_->buckets.size(); ++b) {
      w_->buckets[b].round = remap[round_of_[units_.unit_of[b]]];
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
  const RoundUnits units_;
  const double busiest_link_total_;  // seconds: no assignment's rounds carry less
  // Assignment state.
  int32_t rounds_ = 0;
  std::vector<double> load_;
  std::vector<int64_t> staged_;
  std::vector<double> max_;
  std::vector<double> cand_max_;  // RoundMaxima's results
  std::vector<char> cand_fit_;
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
