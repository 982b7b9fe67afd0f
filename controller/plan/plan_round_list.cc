// List scheduling of round units (plan_round_list.h).
#include "controller/plan/plan_round_list.h"

#include <algorithm>
#include <cmath>
#include <iterator>

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
    std::vector<int32_t> ready;
    for (int32_t v = 0; v < u_.num_units; ++v) {
      for (int32_t c : u_.children.of(v)) ++waiting_[c];
    }
    for (int32_t v = 0; v < u_.num_units; ++v) {
      if (waiting_[v] == 0) ready.push_back(v);
    }
    SortByPriority(ready);
    std::vector<int32_t> placed, kept, next;
    for (int32_t r = 0; !ready.empty(); ++r) {
      FillRound(r, ready, &placed, &kept);
      next.clear();
      for (int32_t v : placed) {
        for (int32_t c : u_.children.of(v)) {
          if (--waiting_[c] == 0) next.push_back(c);
        }
      }
      SortByPriority(next);
      ready.clear();
      std::merge(kept.begin(), kept.end(), next.begin(), next.end(), std::back_inserter(ready),
                 [this](int32_t a, int32_t b) { return Before(a, b); });
    }
    return std::move(round_of_);
  }

 private:
  // Places the ready units that fit into round r (placed), in order; the
  // others stay ready (kept), in order.
  void FillRound(int32_t r, const std::vector<int32_t>& ready, std::vector<int32_t>* placed,
                 std::vector<int32_t>* kept) {
    std::fill(load_.begin(), load_.end(), 0.0);
    std::fill(refused_.begin(), refused_.end(), INFINITY);
    std::fill(staged_.begin(), staged_.end(), 0);
    placed->clear();
    kept->clear();
    for (int32_t v : ready) {
      if (FirstLinkRefuses(v) || !Fits(v)) {
        kept->push_back(v);
        continue;
      }
      Take(v);
      round_of_[v] = r;
      placed->push_back(v);
    }
  }

  bool Before(int32_t a, int32_t b) const {
    if (u_.height[a] != u_.height[b]) return u_.height[a] > u_.height[b];
    if (u_.pair_ordinal[a] != u_.pair_ordinal[b]) return u_.pair_ordinal[a] < u_.pair_ordinal[b];
    if (u_.weight[a] != u_.weight[b]) return u_.weight[a] > u_.weight[b];
    return a < b;
  }

  void SortByPriority(std::vector<int32_t>& v) const {
    std::sort(v.begin(), v.end(), [this](int32_t a, int32_t b) { return Before(a, b); });
  }

  static size_t Link(const LoadEntry& e) {
    return static_cast<size_t>(e.worker) * kNumLinkDirs + e.dir;
  }

  // A shortcut for Fits: whether v's first link refused a unit no heavier
  // than v's load on it in this round (loads only grow within a round), or
  // refuses v now (then remembered).
  bool FirstLinkRefuses(int32_t v) {
    if (u_.load_begin[v] == u_.load_begin[v + 1]) return false;
    const LoadEntry& e = u_.load_entries[u_.load_begin[v]];
    const size_t link = Link(e);
    if (e.seconds >= refused_[link]) return true;
    if (load_[link] > 0 && load_[link] + e.seconds > tau_) {
      refused_[link] = e.seconds;
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
      const double l = load_[Link(u_.load_entries[i])];
      if (l > 0 && l + u_.load_entries[i].seconds > tau_) return false;
    }
    return true;
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
