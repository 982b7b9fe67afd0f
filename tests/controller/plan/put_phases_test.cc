// Put phases: matchings of a sync's peer-write byte matrix, assigned to
// buckets in each pair's (round, seq) order.
#include "controller/plan/put_phases.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

constexpr int64_t kBucket = int64_t{256} << 20;

// Adds `bytes` sender -> receiver as buckets of at most kBucket, spread over
// `rounds` rounds in turn (as a planner's rounds interleave pairs).
void AddPair(v1::Plan* plan, int32_t sender, int32_t receiver, int64_t bytes, int rounds = 3) {
  int32_t seq = 0;
  for (int64_t done = 0, k = 0; done < bytes; done += kBucket, ++k) {
    v1::Bucket* b = plan->add_buckets();
    b->set_id(plan->buckets_size() - 1);
    b->set_sender(sender);
    b->set_receiver(receiver);
    b->set_round(static_cast<int32_t>(k % rounds));
    b->set_seq(seq++);
    b->set_bytes(std::min(kBucket, bytes - done));
    b->set_transport(v1::TRANSPORT_NETWORK);
  }
}

std::vector<WorkerPair> PairsOf(const v1::Plan& plan) {
  std::set<WorkerPair> s;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.transport() == v1::TRANSPORT_NETWORK) s.insert({b.sender(), b.receiver()});
  }
  return {s.begin(), s.end()};
}

// The 4 x H200 colocated byte matrix (FSDP2 over 4 -> 2 x TP2, Llama-3-8B:
// bench/results/gpu-4xh200-2026-11-26.jsonl).
v1::Plan Colocated4() {
  const int64_t s = 604112896, b = 3411150848;
  v1::Plan plan;
  const int64_t m[4][4] = {{0, s, b, s}, {b, 0, b, s}, {s, b, 0, b}, {s, b, s, 0}};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      if (m[i][j] > 0) AddPair(&plan, i, j, m[i][j]);
    }
  }
  return plan;
}

// Megatron TP2 on workers 0-1 -> two TP1 replicas on 2-3.
v1::Plan FanOutTp2() {
  v1::Plan plan;
  const int64_t half = 8030527488;
  for (int w : {0, 1}) {
    for (int r : {2, 3}) AddPair(&plan, w, r, half);
  }
  return plan;
}

struct Checked {
  int64_t busiest = 0;  // the busiest worker's bytes in or out
  int64_t phased = 0;   // sum over phases of the phase's largest pair bytes
  int32_t phases = 0;
};

// Checks what every phase assignment must hold and returns its cost figures.
Checked CheckPhases(const v1::Plan& plan, const std::vector<WorkerPair>& pairs,
                    const PutPhases& phases) {
  Checked c;
  c.phases = phases.num_phases;
  EXPECT_EQ(phases.phase_of_bucket.size(), static_cast<size_t>(plan.buckets_size()));
  std::map<int32_t, std::map<WorkerPair, int64_t>> by_phase;
  std::map<int32_t, int64_t> in, out;
  std::map<WorkerPair, std::vector<std::pair<std::pair<int32_t, int32_t>, int32_t>>> order;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.transport() != v1::TRANSPORT_NETWORK ||
        !std::binary_search(pairs.begin(), pairs.end(), WorkerPair(b.sender(), b.receiver()))) {
      continue;
    }
    const int32_t p = phases.phase_of_bucket[static_cast<size_t>(b.id())];
    EXPECT_GE(p, 0);
    EXPECT_LT(p, std::max(phases.num_phases, 1));
    by_phase[p][{b.sender(), b.receiver()}] += b.bytes();
    out[b.sender()] += b.bytes();
    in[b.receiver()] += b.bytes();
    order[{b.sender(), b.receiver()}].push_back({{b.round(), b.seq()}, p});
  }
  for (auto& [p, bytes] : by_phase) {
    std::map<int32_t, int> writes, written;
    int64_t largest = 0;
    for (const auto& [pair, n] : bytes) {
      EXPECT_EQ(++writes[pair.first], 1)
          << "phase " << p << ": worker " << pair.first << " writes two peers";
      EXPECT_EQ(++written[pair.second], 1)
          << "phase " << p << ": worker " << pair.second << " is written by two";
      largest = std::max(largest, n);
    }
    c.phased += largest;
  }
  for (auto& [pair, list] : order) {
    std::sort(list.begin(), list.end());
    for (size_t k = 1; k < list.size(); ++k) {
      EXPECT_LE(list[k - 1].second, list[k].second)
          << pair.first << " -> " << pair.second << ": phases go back in (round, seq) order";
    }
  }
  for (const auto& [w, n] : in) c.busiest = std::max(c.busiest, n);
  for (const auto& [w, n] : out) c.busiest = std::max(c.busiest, n);
  return c;
}

TEST(PutPhasesTest, ColocatedFourGpusMovesInMatchingsNearItsBusiestWorker) {
  const v1::Plan plan = Colocated4();
  const std::vector<WorkerPair> pairs = PairsOf(plan);
  const Checked c = CheckPhases(plan, pairs, PlanPutPhases(plan, pairs));
  EXPECT_GE(c.phases, 2);
  EXPECT_LE(c.phases, 4 * 4 - 2 * 4 + 2);  // Birkhoff's bound on n x n
  // Bucket rounding only: the phases' maxima add up to the busiest worker's
  // bytes within a bucket or two per phase.
  EXPECT_LE(static_cast<double>(c.phased), 1.10 * static_cast<double>(c.busiest))
      << c.phased << " bytes phased against " << c.busiest;
}

TEST(PutPhasesTest, FanOutOfTwoWritersToTwoReceiversIsTwoPerfectMatchings) {
  const v1::Plan plan = FanOutTp2();
  const std::vector<WorkerPair> pairs = PairsOf(plan);
  const PutPhases phases = PlanPutPhases(plan, pairs);
  const Checked c = CheckPhases(plan, pairs, phases);
  EXPECT_EQ(c.phases, 2);
  EXPECT_EQ(c.phased, c.busiest / 2 * 2);
}

TEST(PutPhasesTest, OnlyNetworkBucketsOfThePairsGetPhases) {
  v1::Plan plan = FanOutTp2();
  v1::Bucket* local = plan.add_buckets();
  local->set_id(plan.buckets_size() - 1);
  local->set_sender(0);
  local->set_receiver(0);
  local->set_bytes(kBucket);
  local->set_transport(v1::TRANSPORT_LOCAL);
  // Only 0 -> 2 and 1 -> 3 write directly: two groups of one phase each,
  // everything else 0.
  const std::vector<WorkerPair> pairs = {{0, 2}, {1, 3}};
  const PutPhases phases = PlanPutPhases(plan, pairs);
  EXPECT_EQ(phases.num_phases, 2);
  for (int32_t p : phases.phase_of_bucket) EXPECT_EQ(p, 0);
  EXPECT_TRUE(PlanPutPhases(plan, {}).phase_of_bucket.empty());
}

TEST(PutPhasesTest, AGroupLargerThanTheLimitKeepsPhaseZero) {
  v1::Plan plan;
  const int32_t n = kMaxPutPhaseWorkers + 1;
  for (int32_t w = 0; w < n; ++w) AddPair(&plan, w, (w + 1) % n, 2 * kBucket);
  // A second, small group still gets its phases.
  AddPair(&plan, 100, 101, kBucket);
  AddPair(&plan, 100, 102, kBucket);
  const std::vector<WorkerPair> pairs = PairsOf(plan);
  const PutPhases phases = PlanPutPhases(plan, pairs);
  EXPECT_EQ(phases.num_phases, 2);
  std::set<int32_t> small;
  for (const v1::Bucket& b : plan.buckets()) {
    const int32_t p = phases.phase_of_bucket[static_cast<size_t>(b.id())];
    if (b.sender() < n) {
      EXPECT_EQ(p, 0) << "bucket " << b.id();
    }
    if (b.sender() == 100) small.insert(p);
  }
  EXPECT_EQ(small, (std::set<int32_t>{0, 1}));
}

TEST(PutPhasesTest, BucketIdsOutOfRangeAndNegativeSizesAreSkippedNotACrash) {
  v1::Plan plan = FanOutTp2();
  plan.mutable_buckets(0)->set_id(1 << 30);
  plan.mutable_buckets(1)->set_id(-7);
  plan.mutable_buckets(2)->set_bytes(-5);
  const std::vector<WorkerPair> pairs = PairsOf(plan);
  const PutPhases phases = PlanPutPhases(plan, pairs);
  EXPECT_EQ(phases.phase_of_bucket.size(), static_cast<size_t>(plan.buckets_size()));
  EXPECT_GE(phases.num_phases, 1);
}

// The phases depend on the buckets, not on where the plan lists them.
TEST(PutPhasesTest, ThePhasesDoNotDependOnTheBucketsListOrder) {
  const v1::Plan plan = Colocated4();
  v1::Plan reversed = plan;
  std::reverse(reversed.mutable_buckets()->begin(), reversed.mutable_buckets()->end());
  const std::vector<WorkerPair> pairs = PairsOf(plan);
  const PutPhases a = PlanPutPhases(plan, pairs);
  const PutPhases b = PlanPutPhases(reversed, pairs);
  EXPECT_EQ(a.phase_of_bucket, b.phase_of_bucket);
  EXPECT_EQ(a.num_phases, b.num_phases);
  // A part's key names its buckets' phases: the same phases, the same key.
  EXPECT_EQ(PutPhasesKey(plan, a.phase_of_bucket), PutPhasesKey(plan, b.phase_of_bucket));
  EXPECT_EQ(PutPhasesKey(plan, a.phase_of_bucket).size(), 19u);
  EXPECT_EQ(PutPhasesKey(plan, std::vector<int32_t>(a.phase_of_bucket.size(), 0)), "");
  std::vector<int32_t> other = a.phase_of_bucket;
  for (int32_t& p : other) p = p == 0 ? 1 : 0;
  EXPECT_NE(PutPhasesKey(plan, other), PutPhasesKey(plan, a.phase_of_bucket));
}

TEST(PutPhasesTest, MarkPeerWritesSetsPhasesOnPeerWriteBucketsOnly) {
  v1::Plan plan = Colocated4();
  const std::vector<WorkerPair> pairs = {{1, 0}, {1, 2}, {2, 1}};
  const PutPhases phases = PlanPutPhases(plan, pairs);
  ASSERT_EQ(phases.num_phases, 2);  // 1 writes 0 and 2, in turn
  MarkPeerWrites(pairs, &plan, phases.phase_of_bucket);
  std::set<int32_t> seen;
  for (const v1::Bucket& b : plan.buckets()) {
    const bool direct = b.route() == v1::ROUTE_PEER_WRITE;
    EXPECT_EQ(direct,
              std::binary_search(pairs.begin(), pairs.end(), WorkerPair(b.sender(), b.receiver())));
    if (direct) {
      seen.insert(b.put_phase());
    } else {
      EXPECT_EQ(b.put_phase(), 0) << "bucket " << b.id();
    }
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
  // Without phases every bucket is back at 0.
  MarkPeerWrites(pairs, &plan);
  for (const v1::Bucket& b : plan.buckets()) EXPECT_EQ(b.put_phase(), 0);
}

// A planned fan-out: trainer TP2 on workers 0-1 -> two TP2 replicas on 2-5.
TEST(PutPhasesTest, APlannedFanOutGetsMatchings) {
  using namespace planner_testing;  // NOLINT
  v1::Side src = Side("trainer", Range(0, 2), 8);
  v1::Side dst = Side("infer", Range(2, 4), 8);
  for (int t = 0; t < 6; ++t) {
    const std::string name = "layer" + std::to_string(t);
    Mesh(&src, name, {64, 32}, {2}, {Sh(0)});
    Mesh(&dst, name, {64, 32}, {2, 2}, {Rep(), Sh(1)});
  }
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_disable_relay(true);
  spec.mutable_options()->set_bucket_bytes(2048);
  const v1::Plan plan = BuildAndVerify(spec);
  const std::vector<WorkerPair> pairs = PeerWriteEligiblePairs(plan);
  ASSERT_EQ(pairs.size(), 8u);
  const Checked c = CheckPhases(plan, pairs, PlanPutPhases(plan, pairs));
  EXPECT_GE(c.phases, 4);  // each trainer writes four receivers in turn
  EXPECT_LE(static_cast<double>(c.phased), 1.25 * static_cast<double>(c.busiest));
}

// The planner's 18-worker fan-out is one group over the limit: phase 0.
TEST(PutPhasesTest, APlannedFanOutOverTheLimitStaysInPhaseZero) {
  const v1::Plan plan = planner_testing::BuildAndVerify(planner_testing::FanOutSpec(true));
  const std::vector<WorkerPair> pairs = PeerWriteEligiblePairs(plan);
  const PutPhases phases = PlanPutPhases(plan, pairs);
  EXPECT_EQ(phases.num_phases, 0);
  for (int32_t p : phases.phase_of_bucket) EXPECT_EQ(p, 0);
}

}  // namespace
}  // namespace wsync::plan
