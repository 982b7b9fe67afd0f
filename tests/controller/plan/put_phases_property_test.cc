// PlanPutPhases on random byte matrices (seeded): groups of 2 to 16 workers,
// sparse and dense, buckets of uneven sizes listed in random order, some
// network pairs left out of the peer writes. Every result must hold what
// put_phases.h promises: each phase a matching, every bucket a phase, a
// pair's buckets in their (round, seq) order, at most Birkhoff's number of
// phases per group, and the phases' byte maxima within bucket rounding of
// the busiest worker's bytes.
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "controller/plan/put_phases.h"
#include "gtest/gtest.h"

namespace wsync::plan {
namespace {

struct Case {
  v1::Plan plan;
  std::vector<WorkerPair> pairs;  // the peer writes, sorted
  int64_t max_bucket = 0;
};

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Bytes of one pair: mostly alike, sometimes orders of magnitude apart (a
// skewed matrix).
int64_t PairBytes(std::mt19937_64& rng) {
  if (Uniform(rng, 0, 3) == 0) return int64_t{1} << Uniform(rng, 0, 30);
  return Uniform(rng, int64_t{1} << 20, int64_t{64} << 20);
}

// One random case: 1 to 3 groups of 2 to 16 workers with dense ids, each
// pair's bytes cut into buckets of up to `max_bucket` (uneven), over random
// rounds; the bucket list shuffled. A quarter of the network pairs are not
// peer writes.
Case RandomCase(std::mt19937_64& rng, bool dense) {
  Case c;
  c.max_bucket = int64_t{1} << Uniform(rng, 20, 24);
  std::vector<v1::Bucket> buckets;
  std::set<WorkerPair> chosen;
  int32_t base = 0;
  const int groups = static_cast<int>(Uniform(rng, 1, 3));
  for (int g = 0; g < groups; ++g) {
    const int32_t n = static_cast<int32_t>(Uniform(rng, 2, kMaxPutPhaseWorkers));
    const double density = dense ? 0.7 + 0.3 * Uniform(rng, 0, 100) / 100.0
                                 : 0.05 + 0.25 * Uniform(rng, 0, 100) / 100.0;
    std::vector<WorkerPair> group_pairs;
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t j = 0; j < n; ++j) {
        if (i != j && Uniform(rng, 0, 999) < density * 1000) {
          group_pairs.push_back({base + i, base + j});
        }
      }
    }
    if (group_pairs.empty()) group_pairs.push_back({base, base + 1});
    for (const WorkerPair& p : group_pairs) {
      const bool peer_write = Uniform(rng, 0, 3) != 0;
      if (peer_write) chosen.insert(p);
      int64_t left = PairBytes(rng);
      int32_t seq = 0;
      while (left > 0) {
        v1::Bucket b;
        b.set_sender(p.first);
        b.set_receiver(p.second);
        b.set_bytes(std::min(left, Uniform(rng, 1, c.max_bucket)));
        b.set_round(static_cast<int32_t>(Uniform(rng, 0, 3)));
        b.set_seq(seq++);
        b.set_transport(v1::TRANSPORT_NETWORK);
        left -= b.bytes();
        buckets.push_back(b);
      }
    }
    base += n;
  }
  std::shuffle(buckets.begin(), buckets.end(), rng);
  for (v1::Bucket& b : buckets) {
    b.set_id(c.plan.buckets_size());
    *c.plan.add_buckets() = std::move(b);
  }
  c.pairs.assign(chosen.begin(), chosen.end());
  return c;
}

// Connected groups of the pairs' workers: worker -> its group's smallest worker.
std::map<int32_t, int32_t> GroupOf(const std::vector<WorkerPair>& pairs) {
  std::map<int32_t, int32_t> parent;
  auto find = [&parent](int32_t w) {
    while (parent[w] != w) w = parent[w];
    return w;
  };
  for (const WorkerPair& p : pairs) {
    parent.try_emplace(p.first, p.first);
    parent.try_emplace(p.second, p.second);
    const int32_t a = find(p.first), b = find(p.second);
    parent[std::max(a, b)] = std::min(a, b);
  }
  std::map<int32_t, int32_t> out;
  for (const auto& [w, unused] : parent) out[w] = find(w);
  return out;
}

// Checks every promise of put_phases.h on `c`'s phases.
void CheckCase(const Case& c, const PutPhases& phases) {
  const v1::Plan& plan = c.plan;
  if (c.pairs.empty()) {  // no peer writes: nothing to phase
    EXPECT_TRUE(phases.phase_of_bucket.empty());
    EXPECT_EQ(phases.num_phases, 0);
    return;
  }
  ASSERT_EQ(phases.phase_of_bucket.size(), static_cast<size_t>(plan.buckets_size()));
  const std::map<int32_t, int32_t> group_of = GroupOf(c.pairs);
  struct Group {
    int32_t workers = 0;
    int32_t used = 0;  // highest phase + 1
    std::map<int32_t, int64_t> in, out;
    std::map<int32_t, std::map<WorkerPair, int64_t>> by_phase;
  };
  std::map<int32_t, Group> groups;
  for (const auto& [w, g] : group_of) ++groups[g].workers;
  std::map<WorkerPair, std::vector<std::tuple<int32_t, int32_t, int32_t>>> streams;
  for (const v1::Bucket& b : plan.buckets()) {
    const int32_t p = phases.phase_of_bucket[static_cast<size_t>(b.id())];
    const WorkerPair pair(b.sender(), b.receiver());
    if (!std::binary_search(c.pairs.begin(), c.pairs.end(), pair)) {
      EXPECT_EQ(p, 0) << "bucket " << b.id() << " is not a peer write";
      continue;
    }
    // Every bucket gets one of the planned phases.
    EXPECT_GE(p, 0) << "bucket " << b.id();
    EXPECT_LT(p, phases.num_phases) << "bucket " << b.id();
    Group& g = groups[group_of.at(b.sender())];
    g.used = std::max(g.used, p + 1);
    g.by_phase[p][pair] += b.bytes();
    g.out[b.sender()] += b.bytes();
    g.in[b.receiver()] += b.bytes();
    streams[pair].emplace_back(b.round(), b.seq(), p);
  }
  // A pair's buckets go through the phases in their (round, seq) order.
  for (auto& [pair, list] : streams) {
    std::sort(list.begin(), list.end());
    for (size_t k = 1; k < list.size(); ++k) {
      EXPECT_LE(std::get<2>(list[k - 1]), std::get<2>(list[k]))
          << pair.first << " -> " << pair.second << ": a phase goes back in (round, seq) order";
    }
  }
  int32_t used = 0, birkhoff = 0;
  for (const auto& [first, g] : groups) {
    SCOPED_TRACE(::testing::Message()
                 << "group of worker " << first << " (" << g.workers << " workers)");
    int64_t phased = 0;  // sum over phases of the phase's largest pair
    for (const auto& [p, bytes] : g.by_phase) {
      // Each phase a matching: a worker writes one peer, is written by one.
      std::set<int32_t> writes, written;
      int64_t largest = 0;
      for (const auto& [pair, n] : bytes) {
        EXPECT_TRUE(writes.insert(pair.first).second)
            << "phase " << p << ": worker " << pair.first << " writes two peers";
        EXPECT_TRUE(written.insert(pair.second).second)
            << "phase " << p << ": worker " << pair.second << " is written by two";
        largest = std::max(largest, n);
      }
      phased += largest;
    }
    int64_t busiest = 0;
    for (const auto& [w, n] : g.in) busiest = std::max(busiest, n);
    for (const auto& [w, n] : g.out) busiest = std::max(busiest, n);
    // The phases' maxima add up to the busiest worker's bytes, give or take
    // a bucket per phase (a bucket goes where its middle byte falls).
    EXPECT_GE(phased, busiest);
    EXPECT_LE(phased, busiest + int64_t{g.used} * c.max_bucket)
        << g.used << " phases, buckets of up to " << c.max_bucket << " bytes";
    const int32_t n = g.workers;
    EXPECT_LE(g.used, (n - 1) * (n - 1) + 1) << "Birkhoff's bound";
    used += g.used;
    birkhoff += (n - 1) * (n - 1) + 1;
  }
  EXPECT_GE(phases.num_phases, used);
  EXPECT_LE(phases.num_phases, birkhoff) << "Birkhoff's bound, summed over the groups";
}

TEST(PutPhasesPropertyTest, RandomMatricesGetMatchingsInOrderWithinTheBounds) {
  constexpr int kCases = 300;
  std::mt19937_64 rng(20261128);
  int64_t buckets = 0;
  for (int i = 0; i < kCases; ++i) {
    SCOPED_TRACE(::testing::Message() << "case " << i << (i % 2 ? " (dense)" : " (sparse)"));
    const Case c = RandomCase(rng, /*dense=*/i % 2 == 1);
    buckets += c.plan.buckets_size();
    const PutPhases phases = PlanPutPhases(c.plan, c.pairs);
    CheckCase(c, phases);
    // Deterministic, and blind to where the plan lists its buckets.
    v1::Plan reversed = c.plan;
    std::reverse(reversed.mutable_buckets()->begin(), reversed.mutable_buckets()->end());
    const PutPhases again = PlanPutPhases(reversed, c.pairs);
    EXPECT_EQ(again.phase_of_bucket, phases.phase_of_bucket);
    EXPECT_EQ(again.num_phases, phases.num_phases);
    if (HasFailure()) break;
  }
  EXPECT_GT(buckets, kCases * 10);
}

}  // namespace
}  // namespace wsync::plan
