// The list scheduler of round units (plan_round_list.h): its contract on
// random relay graphs, and the overlap it exists for (sources' sends beside
// the relays behind them).
#include "controller/plan/plan_round_list.h"

#include <algorithm>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "controller/plan/plan_cost.h"
#include "gtest/gtest.h"

namespace wsync::plan::planner_detail {
namespace {

struct TestUnit {
  std::vector<LoadEntry> loads;  // one entry per (worker, dir)
  std::vector<StageEntry> stages;
  std::vector<int32_t> parents;  // lower ids only
};

// RoundUnits as plan_units.cc builds them: weights, depth and height, the
// pair ordinal from each unit's first two load entries.
RoundUnits MakeUnits(const std::vector<TestUnit>& in) {
  RoundUnits u;
  u.num_units = static_cast<int32_t>(in.size());
  u.load_begin.push_back(0);
  u.stage_begin.push_back(0);
  std::vector<std::pair<int32_t, int32_t>> edges;
  std::map<std::pair<int32_t, int32_t>, int32_t> pairs;
  for (int32_t v = 0; v < u.num_units; ++v) {
    double weight = 0;
    for (const LoadEntry& e : in[v].loads) {
      u.load_entries.push_back(e);
      weight = std::max(weight, e.seconds);
    }
    for (const StageEntry& e : in[v].stages) u.stage_entries.push_back(e);
    u.load_begin.push_back(static_cast<int32_t>(u.load_entries.size()));
    u.stage_begin.push_back(static_cast<int32_t>(u.stage_entries.size()));
    u.weight.push_back(weight);
    for (int32_t p : in[v].parents) edges.emplace_back(p, v);
    const std::pair<int32_t, int32_t> pair = {in[v].loads.empty() ? -1 : in[v].loads[0].worker,
                                              in[v].loads.size() < 2 ? -1 : in[v].loads[1].worker};
    u.pair_ordinal.push_back(pairs[pair]++);
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  u.children.Build(u.num_units, edges, /*by_first=*/true);
  u.parents.Build(u.num_units, edges, /*by_first=*/false);
  u.depth.assign(u.num_units, 0);
  u.height.assign(u.num_units, 0);
  for (int32_t v = 0; v < u.num_units; ++v) {
    for (int32_t c : u.children.of(v)) u.depth[c] = std::max(u.depth[c], u.depth[v] + 1);
  }
  for (int32_t v = u.num_units - 1; v >= 0; --v) {
    for (int32_t p : u.parents.of(v)) u.height[p] = std::max(u.height[p], u.height[v] + 1);
  }
  return u;
}

// A transfer of `seconds` over the NIC from `from` to `to`, staging `bytes`
// on both ends.
TestUnit Send(int32_t from, int32_t to, double seconds, int64_t bytes,
              std::vector<int32_t> parents = {}) {
  return {{{from, kNicOut, seconds}, {to, kNicIn, seconds}},
          {{from, bytes}, {to, bytes}},
          std::move(parents)};
}

// Sum over rounds of the busiest link in the round.
double SumOfRoundMaxima(const RoundUnits& u, const std::vector<int32_t>& round_of) {
  std::map<std::pair<int32_t, size_t>, double> load;
  for (int32_t v = 0; v < u.num_units; ++v) {
    for (int32_t i = u.load_begin[v]; i < u.load_begin[v + 1]; ++i) {
      const LoadEntry& e = u.load_entries[i];
      load[{round_of[v], static_cast<size_t>(e.worker) * kNumLinkDirs + e.dir}] += e.seconds;
    }
  }
  std::map<int32_t, double> max;
  for (const auto& [key, seconds] : load) max[key.first] = std::max(max[key.first], seconds);
  double sum = 0;
  for (const auto& [round, seconds] : max) sum += seconds;
  return sum;
}

TEST(ListScheduleRoundsTest, RandomGraphsKeepOrderCapsAndNoEmptyRound) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t workers = 2 + static_cast<int32_t>(rng() % 6);
    const int32_t n = 1 + static_cast<int32_t>(rng() % 60);
    const int64_t cap = 100;
    std::vector<TestUnit> in;
    for (int32_t v = 0; v < n; ++v) {
      const int32_t from = static_cast<int32_t>(rng() % workers);
      const int32_t to = static_cast<int32_t>((from + 1 + rng() % (workers - 1)) % workers);
      std::vector<int32_t> parents;
      for (int32_t p = 0; p < v; ++p) {
        if (rng() % 10 == 0) parents.push_back(p);
      }
      in.push_back(
          Send(from, to, 1e-3 * (1 + rng() % 9), 1 + static_cast<int64_t>(rng() % cap), parents));
    }
    const RoundUnits units = MakeUnits(in);
    const double tau = 3e-3;
    const std::vector<int32_t> round_of = ListScheduleRounds(units, workers, cap, tau);
    ASSERT_EQ(round_of.size(), in.size());
    const int32_t rounds = *std::max_element(round_of.begin(), round_of.end()) + 1;
    std::vector<int32_t> count(rounds, 0);
    std::map<std::pair<int32_t, size_t>, std::pair<double, int>> link;  // seconds, units
    std::map<std::pair<int32_t, int32_t>, int64_t> staged;
    for (int32_t v = 0; v < n; ++v) {
      ASSERT_GE(round_of[v], 0) << "trial " << trial << " unit " << v;
      ++count[round_of[v]];
      for (int32_t p : in[v].parents) {
        EXPECT_LT(round_of[p], round_of[v])
            << "trial " << trial << ": unit " << v << "'s parent " << p;
      }
      for (const LoadEntry& e : in[v].loads) {
        auto& l = link[{round_of[v], static_cast<size_t>(e.worker) * kNumLinkDirs + e.dir}];
        l.first += e.seconds;
        ++l.second;
      }
      for (const StageEntry& e : in[v].stages) staged[{round_of[v], e.worker}] += e.bytes;
    }
    for (int32_t r = 0; r < rounds; ++r)
      EXPECT_GT(count[r], 0) << "trial " << trial << " round " << r;
    for (const auto& [key, l] : link) {
      if (l.second > 1) {
        EXPECT_LE(l.first, tau * (1 + 1e-12)) << "trial " << trial;
      }
    }
    for (const auto& [key, bytes] : staged) EXPECT_LE(bytes, cap) << "trial " << trial;
    // No unit waited needlessly: in every round it was ready for before its
    // own, it did not fit even the round's final loads (loads only grow
    // while a round fills).
    for (int32_t v = 0; v < n; ++v) {
      int32_t ready = 0;
      for (int32_t p : in[v].parents) ready = std::max(ready, round_of[p] + 1);
      for (int32_t r = ready; r < round_of[v]; ++r) {
        bool fits = true;
        for (const StageEntry& e : in[v].stages) {
          fits = fits && staged[{r, e.worker}] + e.bytes <= cap;
        }
        for (const LoadEntry& e : in[v].loads) {
          const double l = link[{r, static_cast<size_t>(e.worker) * kNumLinkDirs + e.dir}].first;
          fits = fits && (l == 0 || l + e.seconds <= tau);
        }
        EXPECT_FALSE(fits) << "trial " << trial << ": unit " << v << " fit round " << r
                           << " but went to round " << round_of[v];
      }
    }
  }
}

// FSDP shards fanned out to replicas, as Kimi-K2 from FSDP2 to vLLM
// replicas: four sources each hold a quarter of the blocks; replica r's rank
// at position p needs the blocks of position p. Each block goes from its
// source to one replica's rank (its root), which forwards it to the same
// position of the other replicas. A source's egress and a rank's ingress
// then total the same, so a schedule that fills the sends before the relays
// behind them (what the greedy fits, in relay generations, tend to) takes up
// to twice the busiest link; rounds filled in time order keep each relay a
// round behind its block.
TEST(ListScheduleRoundsTest, RelaysOverlapTheSendsTheyFollow) {
  constexpr int32_t kSources = 4, kPositions = 4, kReplicas = 4, kBlocks = 512;
  const double block = 1e-3;
  const auto rank = [](int32_t replica, int32_t position) {
    return kSources + replica * kPositions + position;
  };
  std::vector<TestUnit> in;
  for (int32_t b = 0; b < kBlocks; ++b) {
    const int32_t position = (b / kSources) % kPositions;
    const int32_t root = (b / (kSources * kPositions)) % kReplicas;
    const int32_t parent = static_cast<int32_t>(in.size());
    in.push_back(Send(b % kSources, rank(root, position), block, 1));
    for (int32_t k = 1; k < kReplicas; ++k) {
      in.push_back(
          Send(rank(root, position), rank((root + k) % kReplicas, position), block, 1, {parent}));
    }
  }
  const int32_t workers = kSources + kReplicas * kPositions;
  const RoundUnits units = MakeUnits(in);
  const double busiest = BusiestLinkTotal(units, workers);
  EXPECT_NEAR(busiest, block * kBlocks / kSources, 1e-12);
  const std::vector<int32_t> round_of =
      ListScheduleRounds(units, workers, /*staging_cap=*/1 << 20, busiest / 16);
  const int32_t rounds = *std::max_element(round_of.begin(), round_of.end()) + 1;
  EXPECT_LE(SumOfRoundMaxima(units, round_of), 1.2 * busiest) << rounds << " rounds";
}

TEST(ListScheduleRoundsTest, EmptyAndLinklessUnits) {
  EXPECT_TRUE(ListScheduleRounds(MakeUnits({}), 2, 10, 1.0).empty());
  // Units without loads (zero-byte transfers) all fit the first round.
  std::vector<TestUnit> in(3);
  in[2].parents = {0};
  const std::vector<int32_t> round_of = ListScheduleRounds(MakeUnits(in), 2, 10, 1.0);
  EXPECT_EQ(round_of, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(BusiestLinkTotal(MakeUnits({}), 0), 0.0);
}

}  // namespace
}  // namespace wsync::plan::planner_detail
