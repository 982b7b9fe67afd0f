// CutRoundIntoGroups (round_groups.h), the cut NCCL issues a round in: for
// random rounds over a few ranks, some with steps and some without, every
// request lands in exactly one group, a rank's groups come in (step, part)
// order, and both sides of every bucket give it the same (step, part): the
// precondition for ranks that issue their groups in that order never to
// wait on each other in a cycle.
#include "worker/plane/round_groups.h"

#include <algorithm>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace wsync::transport {
namespace {

struct Bucket {
  int32_t sender, receiver, step;
  int64_t tag;
  size_t bytes;
};

// (step, part) of each tag this rank moves, from its groups (a step's parts
// are consecutive groups; one no list has bytes in is empty); fails the
// test on a group mixing steps or groups out of order.
std::map<std::pair<bool, int64_t>, std::pair<int32_t, int32_t>> Labels(
    const std::vector<RoundGroup>& groups) {
  std::map<std::pair<bool, int64_t>, std::pair<int32_t, int32_t>> out;
  int32_t last_step = -1, part = 0;
  for (const RoundGroup& g : groups) {
    std::vector<int32_t> steps;
    for (const SendRequest* s : g.sends) steps.push_back(s->step);
    for (const RecvRequest* r : g.recvs) steps.push_back(r->step);
    if (steps.empty()) {  // a part no list of this rank has bytes in: still a part
      EXPECT_GE(last_step, 0) << "an empty first group";
      ++part;
      continue;
    }
    // NCCL matches a pair's operations in issue order: each side of a group
    // keeps (peer, tag) order.
    auto in_order = [](const auto& list) {
      return std::is_sorted(list.begin(), list.end(), [](const auto* x, const auto* y) {
        return std::make_pair(x->peer, x->tag) < std::make_pair(y->peer, y->tag);
      });
    };
    EXPECT_TRUE(in_order(g.sends) && in_order(g.recvs)) << "a group out of (peer, tag) order";
    const int32_t step = steps.front();
    EXPECT_TRUE(std::all_of(steps.begin(), steps.end(), [&](int32_t s) { return s == step; }));
    EXPECT_GE(step, last_step) << "groups out of step order";
    part = step == last_step ? part + 1 : 0;
    last_step = step;
    for (const SendRequest* s : g.sends) out[{true, s->tag}] = {step, part};
    for (const RecvRequest* r : g.recvs) out[{false, r->tag}] = {step, part};
  }
  return out;
}

TEST(RoundGroupsTest, BothSidesOfEveryBucketShareItsStepAndPart) {
  constexpr int kRanks = 5;
  RoundHooks hooks;
  hooks.max_landing_parts = 4;
  hooks.min_landing_part_bytes = 1000;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 gen(seed);
    auto pick = [&gen](int lo, int hi) { return std::uniform_int_distribution<>(lo, hi)(gen); };
    std::vector<bool> stepped(kRanks);
    for (int r = 0; r < kRanks; ++r) stepped[r] = pick(0, 2) > 0;
    std::vector<Bucket> buckets;
    for (int64_t tag = 0, n = pick(1, 40); tag < n; ++tag) {
      const int32_t a = pick(0, kRanks - 1), b = (a + pick(1, kRanks - 1)) % kRanks;
      const int32_t step = stepped[a] && stepped[b] ? pick(0, 3) : 0;
      buckets.push_back({a, b, step, tag, static_cast<size_t>(pick(0, 4000))});
    }
    std::vector<std::vector<SendRequest>> sends(kRanks);
    std::vector<std::vector<RecvRequest>> recvs(kRanks);
    for (const Bucket& k : buckets) {
      sends[k.sender].push_back({k.receiver, k.tag, nullptr, k.bytes, k.step});
      recvs[k.receiver].push_back({k.sender, k.tag, nullptr, k.bytes, k.step});
    }
    std::vector<std::map<std::pair<bool, int64_t>, std::pair<int32_t, int32_t>>> labels(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      std::vector<const SendRequest*> s;
      std::vector<const RecvRequest*> q;
      for (const SendRequest& x : sends[r]) s.push_back(&x);
      for (const RecvRequest& x : recvs[r]) q.push_back(&x);
      auto by_peer_tag = [](const auto* x, const auto* y) {
        return std::make_pair(x->peer, x->tag) < std::make_pair(y->peer, y->tag);
      };
      std::sort(s.begin(), s.end(), by_peer_tag);
      std::sort(q.begin(), q.end(), by_peer_tag);
      const std::vector<RoundGroup> groups = CutRoundIntoGroups(s, q, hooks);
      labels[r] = Labels(groups);
      EXPECT_EQ(labels[r].size(), s.size() + q.size()) << "seed " << seed << " rank " << r;
    }
    for (const Bucket& k : buckets) {
      const auto sent = labels[k.sender][std::make_pair(true, k.tag)];
      const auto received = labels[k.receiver][std::make_pair(false, k.tag)];
      EXPECT_EQ(sent, received) << "seed " << seed << " bucket " << k.tag << " (" << k.sender
                                << " -> " << k.receiver << ", step " << k.step << ")";
    }
    if (HasFailure()) break;
  }
}

// Without steps and landing parts a round is one group, in request order.
TEST(RoundGroupsTest, ARoundWithoutStepsOrPartsIsOneGroup) {
  SendRequest s[2] = {{1, 1, nullptr, 8}, {2, 2, nullptr, 8}};
  RecvRequest r[1] = {{1, 3, nullptr, 8}};
  const std::vector<RoundGroup> groups = CutRoundIntoGroups({&s[0], &s[1]}, {&r[0]}, RoundHooks());
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].sends, (std::vector<const SendRequest*>{&s[0], &s[1]}));
  EXPECT_EQ(groups[0].recvs, (std::vector<const RecvRequest*>{&r[0]}));
}

}  // namespace
}  // namespace wsync::transport
