#include "worker/plane/put_order.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace wsync::plane {
namespace {

std::vector<int> PeersInOrder(const std::vector<PutShare>& shares, int first_peer) {
  std::vector<int> peers;
  for (size_t i : InterleaveByPeer(shares, first_peer)) peers.push_back(shares[i].peer);
  return peers;
}

TEST(InterleaveByPeerTest, OnePeerKeepsTheListAsItIs) {
  const std::vector<PutShare> shares = {{3, 10}, {3, 1}, {3, 7}};
  EXPECT_EQ(InterleaveByPeer(shares, 0), (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(InterleaveByPeer({}, 0).empty());
}

TEST(InterleaveByPeerTest, AListGroupedByPeerAlternatesAndRotatesWithTheFirstPeer) {
  // What a plan emits: every bucket to peer 2, then every bucket to peer 3.
  const std::vector<PutShare> shares = {{2, 8}, {2, 8}, {2, 8}, {3, 8}, {3, 8}, {3, 8}};
  EXPECT_EQ(PeersInOrder(shares, 2), (std::vector<int>{2, 3, 2, 3, 2, 3}));
  EXPECT_EQ(PeersInOrder(shares, 3), (std::vector<int>{3, 2, 3, 2, 3, 2}));
  // A first peer that is not in the list starts at the next one, cyclically.
  EXPECT_EQ(PeersInOrder(shares, 0), (std::vector<int>{2, 3, 2, 3, 2, 3}));
  EXPECT_EQ(PeersInOrder(shares, 4), (std::vector<int>{2, 3, 2, 3, 2, 3}));
}

TEST(InterleaveByPeerTest, EveryPrefixHoldsEachPeerInProportionToItsTotal) {
  // Peer 0 has 3 x the bytes of peer 1 and 6 x those of peer 2.
  std::vector<PutShare> shares;
  for (int i = 0; i < 60; ++i) shares.push_back({0, 3});
  for (int i = 0; i < 30; ++i) shares.push_back({1, 2});
  for (int i = 0; i < 10; ++i) shares.push_back({2, 3});
  const std::vector<size_t> order = InterleaveByPeer(shares, 1);
  ASSERT_EQ(order.size(), shares.size());
  const std::map<int, double> total = {{0, 180}, {1, 60}, {2, 30}};
  std::map<int, int64_t> sent;
  for (size_t k = 0; k < order.size(); ++k) {
    const PutShare& s = shares[order[k]];
    sent[s.peer] += s.bytes;
    // No peer runs ahead of another by more than one entry's share.
    for (const auto& [p, t] : total) {
      for (const auto& [q, u] : total) {
        EXPECT_LE(sent[p] / t - sent[q] / u, 3.0 / 30 + 1e-9) << "after " << k + 1 << " entries";
      }
    }
  }
}

TEST(InterleaveByPeerTest, EntriesOfOnePeerKeepTheirOrderAndNoneIsLost) {
  const std::vector<PutShare> shares = {{5, 100}, {1, 1}, {5, 0}, {1, 50}, {5, 7}, {1, 1}};
  const std::vector<size_t> order = InterleaveByPeer(shares, 1);
  std::vector<size_t> of5, of1;
  for (size_t i : order) (shares[i].peer == 5 ? of5 : of1).push_back(i);
  EXPECT_EQ(of5, (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(of1, (std::vector<size_t>{1, 3, 5}));
}

TEST(InterleaveByPeerTest, HugeSharesCompareExactly) {
  const int64_t big = int64_t{1} << 62;
  const std::vector<PutShare> shares = {{0, big}, {0, big - 1}, {1, big - 1}, {1, big}};
  // Peer 1's entries each sit one byte earlier in its total than peer 0's.
  EXPECT_EQ(InterleaveByPeer(shares, 0), (std::vector<size_t>{2, 0, 3, 1}));
}

TEST(CutIntoPartsTest, CutsWholeUnitsOfAtMostTheLimit) {
  EXPECT_EQ(CutIntoParts(100, 1 << 20, 32 << 20).parts, 4);
  EXPECT_EQ(CutIntoParts(100, 1 << 20, 32 << 20).units_per_part, 32);
  // A unit larger than the limit is one part per unit.
  EXPECT_EQ(CutIntoParts(3, 64 << 20, 32 << 20).parts, 3);
  EXPECT_EQ(CutIntoParts(3, 64 << 20, 32 << 20).units_per_part, 1);
  // Small, single-unit, empty or unlimited: one part.
  EXPECT_EQ(CutIntoParts(10, 1, 32 << 20).parts, 1);
  EXPECT_EQ(CutIntoParts(1, int64_t{1} << 40, 1).parts, 1);
  EXPECT_EQ(CutIntoParts(0, 8, 1).parts, 1);
  EXPECT_EQ(CutIntoParts(10, 8, 0).parts, 1);
  EXPECT_EQ(CutIntoParts(10, 8, 0).units_per_part, 10);
}

}  // namespace
}  // namespace wsync::plane
