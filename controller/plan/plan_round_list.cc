// List scheduling of round units (plan_round_list.h).
#include "controller/plan/plan_round_list.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>

#include "controller/plan/plan_cost.h"

namespace wsync::plan::planner_detail {
namespace {

class ListScheduler {
 public:
  ListScheduler(const RoundUnits& units, int32_t num_workers, int64_t cap, double round_seconds)
      : u_(units),
        cap_(cap),
        tau_(round_seconds),
        load_(static_cast<size_t>(num_workers) * kNumLinkDirs, 0.0),
        refused_(load_.size(), INFINITY),
        staged_(num_workers, 0),
        round_of_(units.num_units, -1),
        waiting_(units.num_units, 0) {}

  std::vector<int32_t> Run() {
    RankByPriority();
    for (int32_t v = 0; v < u_.num_units; ++v) {
      for (int32_t c : u_.children.of(v)) ++waiting_[c];
    }
    // Ready units as their priority ranks: ordering is then by value.
    std::vector<int32_t> ready, kept, next;
    for (int32_t k = 0; k < u_.num_units; ++k) {
      if (waiting_[order_[k]] == 0) ready.push_back(k);
    }
    std::vector<int32_t> placed;
    for (int32_t r = 0; !ready.empty(); ++r) {
      FillRound(r, ready, &placed, &kept);
      next.clear();
      for (int32_t v : placed) {
        for (int32_t c : u_.children.of(v)) {
          if (--waiting_[c] == 0) next.push_back(rank_of_[c]);
        }
      }
      std::sort(next.begin(), next.end());
      ready.clear();
      std::merge(kept.begin(), kept.end(), next.begin(), next.end(), std::back_inserter(ready));
    }
    return std::move(round_of_);
  }

 private:
  // order_: units by priority (the longest relay chain below first, then
  // the lower pair ordinal, the heavier, the lower id); rank_of_ its
  // inverse; per rank, the unit's first link and its seconds there (read
  // in rank order by a round's scan, which skips most units on them).
  void RankByPriority() {
    order_.resize(u_.num_units);
    std::iota(order_.begin(), order_.end(), 0);
    std::sort(order_.begin(), order_.end(), [this](int32_t a, int32_t b) {
      if (u_.height[a] != u_.height[b]) return u_.height[a] > u_.height[b];
      if (u_.pair_ordinal[a] != u_.pair_ordinal[b]) {
        return u_.pair_ordinal[a] < u_.pair_ordinal[b];
      }
      if (u_.weight[a] != u_.weight[b]) return u_.weight[a] > u_.weight[b];
      return a < b;
    });
    rank_of_.resize(u_.num_units);
    first_link_.assign(u_.num_units, -1);
    first_seconds_.assign(u_.num_units, 0.0);
    for (int32_t k = 0; k < u_.num_units; ++k) {
      const int32_t v = order_[k];
      rank_of_[v] = k;
      if (u_.load_begin[v] < u_.load_begin[v + 1]) {
        const LoadEntry& e = u_.load_entries[u_.load_begin[v]];
        first_link_[k] = static_cast<int32_t>(Link(e));
        first_seconds_[k] = e.seconds;
      }
    }
  }

  // Places the ready units (ranks, ascending) that fit into round r (placed:
  // units); the others stay ready (kept: ranks, ascending).
  void FillRound(int32_t r, const std::vector<int32_t>& ready, std::vector<int32_t>* placed,
                 std::vector<int32_t>* kept) {
    std::fill(load_.begin(), load_.end(), 0.0);
    std::fill(refused_.begin(), refused_.end(), INFINITY);
    std::fill(staged_.begin(), staged_.end(), 0);
    placed->clear();
    kept->clear();
    for (int32_t k : ready) {
      const int32_t v = order_[k];
      // The first ready unit always goes: progress even where no unit fits
      // alone (only a non-finite load could make that so).
      if (!placed->empty() && (FirstLinkRefuses(k) || !Fits(v))) {
        kept->push_back(k);
        continue;
      }
      Take(v);
      round_of_[v] = r;
      placed->push_back(v);
    }
  }

  static size_t Link(const LoadEntry& e) {
    return static_cast<size_t>(e.worker) * kNumLinkDirs + e.dir;
  }

  // A shortcut for Fits: whether the first link of the unit ranked k refused
  // a unit no heavier than its load there in this round (loads only grow
  // within a round), or refuses it now (then remembered).
  bool FirstLinkRefuses(int32_t k) {
    if (first_link_[k] < 0) return false;
    const size_t link = static_cast<size_t>(first_link_[k]);
    const double seconds = first_seconds_[k];
    if (load_[link] > 0 && seconds >= refused_[link]) return true;
    if (FillsPast(load_[link], seconds)) {
      refused_[link] = seconds;
      return true;
    }
    return false;
  }

  bool Fits(int32_t v) const {
    for (int32_t i = u_.stage_begin[v]; i < u_.stage_begin[v + 1]; ++i) {
      const StageEntry& e = u_.stage_entries[i];
      if (staged_[e.worker] + e.bytes > cap_) return false;
    }
    for (int32_t i = u_.load_begin[v]; i < u_.load_begin[v + 1]; ++i) {
      if (FillsPast(load_[Link(u_.load_entries[i])], u_.load_entries[i].seconds)) return false;
    }
    return true;
  }

  // Whether `seconds` more on a link carrying `load` goes past the round's
  // length (a link with nothing on it yet takes anything; nothing adds
  // nothing).
  bool FillsPast(double load, double seconds) const {
    return load > 0 && seconds > 0 && load + seconds > tau_;
  }

  void Take(int32_t v) {
    for (int32_t i = u_.stage_begin[v]; i < u_.stage_begin[v + 1]; ++i) {
      staged_[u_.stage_entries[i].worker] += u_.stage_entries[i].bytes;
    }
    for (int32_t i = u_.load_begin[v]; i < u_.load_begin[v + 1]; ++i) {
      load_[Link(u_.load_entries[i])] += u_.load_entries[i].seconds;
    }
  }

  const RoundUnits& u_;
  const int64_t cap_;
  const double tau_;
  // The open round: seconds per (worker, link direction), the lightest load
  // each link refused, staged bytes per worker.
  std::vector<double> load_, refused_;
  std::vector<int64_t> staged_;
  std::vector<int32_t> round_of_;
  std::vector<int32_t> waiting_;  // per unit: parents not yet in a closed round
  std::vector<int32_t> order_, rank_of_, first_link_;
  std::vector<double> first_seconds_;
};

}  // namespace

std::vector<int32_t> ListScheduleRounds(const RoundUnits& units, int32_t num_workers,
                                        int64_t staging_cap, double round_seconds) {
  return ListScheduler(units, num_workers, staging_cap, round_seconds).Run();
}

double BusiestLinkTotal(const RoundUnits& units, int32_t num_workers) {
  std::vector<double> total(static_cast<size_t>(num_workers) * kNumLinkDirs, 0.0);
  for (const LoadEntry& e : units.load_entries) {
    total[static_cast<size_t>(e.worker) * kNumLinkDirs + e.dir] += e.seconds;
  }
  return total.empty() ? 0.0 : *std::max_element(total.begin(), total.end());
}

}  // namespace wsync::plan::planner_detail
