// DirectWriteEligiblePairs: which sender -> receiver pairs of a plan may
// write destinations directly.
#include "controller/plan/direct_writes.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::Piece* AddBucket(v1::Plan* plan, int32_t sender, int32_t receiver, int pieces = 1,
                     v1::TransportKind transport = v1::TRANSPORT_NETWORK) {
  v1::Bucket* b = plan->add_buckets();
  b->set_id(plan->buckets_size() - 1);
  b->set_sender(sender);
  b->set_receiver(receiver);
  b->set_transport(transport);
  v1::Piece* last = nullptr;
  for (int i = 0; i < pieces; ++i) {
    last = b->add_pieces();
    last->set_bucket_offset(i * 16);
  }
  return last;  // the bucket's last piece, for the test to spoil
}

TEST(DirectWritesTest, PlainNetworkBucketsAreEligibleSortedAndOnce) {
  v1::Plan plan;
  AddBucket(&plan, 1, 2, 3);
  AddBucket(&plan, 0, 2);
  AddBucket(&plan, 0, 2);  // a second bucket of the same pair: listed once
  AddBucket(&plan, 1, 3);
  EXPECT_THAT(DirectWriteEligiblePairs(plan),
              ElementsAre(WorkerPair(0, 2), WorkerPair(1, 2), WorkerPair(1, 3)));
}

TEST(DirectWritesTest, LocalBucketsAndSelfPairsAreNotPairs) {
  v1::Plan plan;
  AddBucket(&plan, 0, 0, 1, v1::TRANSPORT_LOCAL);
  AddBucket(&plan, 1, 1);  // a malformed self "network" bucket
  EXPECT_THAT(DirectWriteEligiblePairs(plan), IsEmpty());
}

TEST(DirectWritesTest, AnyNonPlainPieceMakesItsPairIneligible) {
  // Each case spoils one piece of one bucket of pair (0, 1); a second,
  // plain bucket of the pair and an untouched pair (2, 1) are there too.
  const std::vector<std::pair<const char*, void (*)(v1::Piece*)>> spoilers = {
      {"reduce", [](v1::Piece* p) { p->set_reduce_id(7); }},
      {"quantize", [](v1::Piece* p) { p->set_quantize_id(3); }},
      {"relay", [](v1::Piece* p) { p->set_relay(true); }},
      {"quant_block",
       [](v1::Piece* p) {
         p->add_quant_block(128);
         p->add_quant_block(128);
       }},
      {"scales", [](v1::Piece* p) { p->set_scales_of(1); }},
  };
  for (const auto& [what, spoil] : spoilers) {
    SCOPED_TRACE(what);
    v1::Plan plan;
    AddBucket(&plan, 0, 1, 2);
    spoil(AddBucket(&plan, 0, 1, 3));
    AddBucket(&plan, 2, 1);
    EXPECT_THAT(DirectWriteEligiblePairs(plan), ElementsAre(WorkerPair(2, 1)));
  }
}

TEST(DirectWritesTest, AReceiverThatRelaysGetsNoDirectWrites) {
  v1::Plan plan;
  AddBucket(&plan, 0, 1);
  AddBucket(&plan, 2, 1);
  AddBucket(&plan, 0, 3);
  // Worker 1 forwards what it received to 3: its destinations are read by
  // its own sends, so nobody may write them behind its rounds.
  AddBucket(&plan, 1, 3, 2)->set_relay(true);
  EXPECT_THAT(DirectWriteEligiblePairs(plan), ElementsAre(WorkerPair(0, 3)));
}

TEST(DirectWritesTest, ARelayInALocalBucketAlsoCounts) {
  v1::Plan plan;
  AddBucket(&plan, 0, 1);
  AddBucket(&plan, 1, 1, 1, v1::TRANSPORT_LOCAL)->set_relay(true);
  EXPECT_THAT(DirectWriteEligiblePairs(plan), IsEmpty());
}

TEST(DirectWritesTest, PlannedFanOutWithAndWithoutRelays) {
  using namespace planner_testing;  // NOLINT
  // The planner's relay fan-out (FanOutSpec).
  auto fan_out = [](bool disable_relay) { return BuildAndVerify(FanOutSpec(disable_relay)); };
  // Without relays every network pair is plain.
  const v1::Plan plain = fan_out(true);
  std::set<WorkerPair> network;
  for (const v1::Bucket& b : plain.buckets()) {
    if (b.transport() == v1::TRANSPORT_NETWORK) network.insert({b.sender(), b.receiver()});
  }
  ASSERT_FALSE(network.empty());
  const std::vector<WorkerPair> all = DirectWriteEligiblePairs(plain);
  EXPECT_EQ(std::set<WorkerPair>(all.begin(), all.end()), network);
  // With relays: the result equals a brute-force reading of the rule over
  // the planned buckets (pieces checked field by field here).
  const v1::Plan relayed = fan_out(false);
  ASSERT_GT(relayed.summary().num_relay_pieces(), 0);
  std::set<int32_t> relayers;
  std::set<WorkerPair> pairs, spoiled;
  for (const v1::Bucket& b : relayed.buckets()) {
    for (const v1::Piece& p : b.pieces()) {
      if (p.relay()) relayers.insert(b.sender());
    }
    if (b.transport() != v1::TRANSPORT_NETWORK) continue;
    pairs.insert({b.sender(), b.receiver()});
    for (const v1::Piece& p : b.pieces()) {
      if (p.relay() || p.reduce_id() != 0 || p.quantize_id() != 0 || p.scales_of() != 0 ||
          p.quant_block_size() != 0) {
        spoiled.insert({b.sender(), b.receiver()});
      }
    }
  }
  std::set<WorkerPair> expected;
  for (const WorkerPair& pair : pairs) {
    if (spoiled.count(pair) == 0 && relayers.count(pair.second) == 0) expected.insert(pair);
  }
  const std::vector<WorkerPair> got = DirectWriteEligiblePairs(relayed);
  EXPECT_EQ(std::set<WorkerPair>(got.begin(), got.end()), expected);
  // Relays take pairs away from direct writes (in this fan-out every replica
  // forwards or is fed by a forwarder, so none is left).
  EXPECT_LT(got.size(), pairs.size());
}

}  // namespace
}  // namespace wsync::plan
