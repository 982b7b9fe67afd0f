// Routes: which sender -> receiver pairs of a plan may write destinations
// directly, which of them can connect, and how a worker part is marked.
#include "controller/plan/routes.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::Piece* AddBucket(v1::Plan* plan, int32_t sender, int32_t receiver, int pieces = 1,
                     v1::BucketTransport transport = v1::TRANSPORT_NETWORK) {
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

TEST(RoutesTest, PlainNetworkBucketsAreEligibleSortedAndOnce) {
  v1::Plan plan;
  AddBucket(&plan, 1, 2, 3);
  AddBucket(&plan, 0, 2);
  AddBucket(&plan, 0, 2);  // a second bucket of the same pair: listed once
  AddBucket(&plan, 1, 3);
  EXPECT_THAT(PeerWriteEligiblePairs(plan),
              ElementsAre(WorkerPair(0, 2), WorkerPair(1, 2), WorkerPair(1, 3)));
}

TEST(RoutesTest, LocalBucketsAndSelfPairsAreNotPairs) {
  v1::Plan plan;
  AddBucket(&plan, 0, 0, 1, v1::TRANSPORT_LOCAL);
  AddBucket(&plan, 1, 1);  // a malformed self "network" bucket
  EXPECT_THAT(PeerWriteEligiblePairs(plan), IsEmpty());
}

TEST(RoutesTest, AnyNonPlainPieceMakesItsPairIneligible) {
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
    EXPECT_THAT(PeerWriteEligiblePairs(plan), ElementsAre(WorkerPair(2, 1)));
  }
}

TEST(RoutesTest, AReceiverThatRelaysGetsNoDirectWrites) {
  v1::Plan plan;
  AddBucket(&plan, 0, 1);
  AddBucket(&plan, 2, 1);
  AddBucket(&plan, 0, 3);
  // Worker 1 forwards what it received to 3: its destinations are read by
  // its own sends, so nobody may write them behind its rounds.
  AddBucket(&plan, 1, 3, 2)->set_relay(true);
  EXPECT_THAT(PeerWriteEligiblePairs(plan), ElementsAre(WorkerPair(0, 3)));
}

TEST(RoutesTest, ARelayInALocalBucketAlsoCounts) {
  v1::Plan plan;
  AddBucket(&plan, 0, 1);
  AddBucket(&plan, 1, 1, 1, v1::TRANSPORT_LOCAL)->set_relay(true);
  EXPECT_THAT(PeerWriteEligiblePairs(plan), IsEmpty());
}

// A run stands for pieces that differ from its first in names and offsets
// only: a relayed run makes its sender a relayer, a run cast twice on the
// way makes its pair ineligible, like the pieces it stands for.
TEST(RoutesTest, PieceRunsCountLikeTheirPieces) {
  v1::Plan plan;
  AddBucket(&plan, 0, 1);
  AddBucket(&plan, 2, 3);
  AddBucket(&plan, 4, 5);
  v1::Bucket* relayed = plan.add_buckets();  // 1 forwards to 6 through a run only
  relayed->set_sender(1);
  relayed->set_receiver(6);
  v1::PieceRun* r = relayed->add_runs();
  r->mutable_first()->set_relay(true);
  r->set_count(4);
  v1::PieceRun* cast = plan.mutable_buckets(1)->add_runs();  // fp32 -> bf16 -> fp16
  cast->mutable_first()->mutable_src()->set_dtype(v1::FP32);
  cast->mutable_first()->set_wire_dtype(v1::BF16);
  cast->mutable_first()->mutable_dst()->set_dtype(v1::FP16);
  cast->set_count(2);
  plan.mutable_buckets(2)->add_runs()->set_count(2);  // plain: (4, 5) stays eligible
  EXPECT_THAT(PeerWriteEligiblePairs(plan), ElementsAre(WorkerPair(4, 5)));
}

TEST(RoutesTest, PlannedFanOutWithAndWithoutRelays) {
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
  const std::vector<WorkerPair> all = PeerWriteEligiblePairs(plain);
  EXPECT_EQ(std::set<WorkerPair>(all.begin(), all.end()), network);
  // With relays: the result equals a brute-force reading of the rule over
  // the planned buckets (pieces checked field by field here).
  const v1::Plan relayed = fan_out(false);
  ASSERT_GT(relayed.summary().num_relay_pieces(), 0);
  std::set<int32_t> relayers;
  std::set<WorkerPair> pairs, spoiled;
  ForEachPlanPiece(relayed, [&](const v1::Bucket& b, const v1::Piece& p) {  // members too
    if (p.relay()) relayers.insert(b.sender());
    if (b.transport() != v1::TRANSPORT_NETWORK) return;
    pairs.insert({b.sender(), b.receiver()});
    if (p.relay() || p.reduce_id() != 0 || p.quantize_id() != 0 || p.scales_of() != 0 ||
        p.quant_block_size() != 0) {
      spoiled.insert({b.sender(), b.receiver()});
    }
  });
  std::set<WorkerPair> expected;
  for (const WorkerPair& pair : pairs) {
    if (spoiled.count(pair) == 0 && relayers.count(pair.second) == 0) expected.insert(pair);
  }
  const std::vector<WorkerPair> got = PeerWriteEligiblePairs(relayed);
  EXPECT_EQ(std::set<WorkerPair>(got.begin(), got.end()), expected);
  // Relays take pairs away from direct writes (in this fan-out every replica
  // forwards or is fed by a forwarder, so none is left).
  EXPECT_LT(got.size(), pairs.size());
}

RouteEndpoint Endpoint(const std::string& domain, const std::string& gpu = "",
                       std::vector<std::string> peers = {}) {
  RouteEndpoint e;
  e.domain = domain;
  e.device_uuid = gpu;
  e.peer_gpus = std::move(peers);
  return e;
}

TEST(RoutesTest, CanPeerWriteNeedsOneNonEmptyDomain) {
  EXPECT_TRUE(CanPeerWrite(Endpoint("h"), Endpoint("h"), v1::TRANSPORT_GLOO));
  EXPECT_FALSE(CanPeerWrite(Endpoint("h"), Endpoint("g"), v1::TRANSPORT_GLOO));
  EXPECT_FALSE(CanPeerWrite(Endpoint(""), Endpoint(""), v1::TRANSPORT_GLOO));
  RouteEndpoint unavailable = Endpoint("h");
  unavailable.unavailable = true;
  EXPECT_FALSE(CanPeerWrite(unavailable, Endpoint("h"), v1::TRANSPORT_GLOO));
  // The receiver's own report does not stop others writing it.
  EXPECT_TRUE(CanPeerWrite(Endpoint("h"), unavailable, v1::TRANSPORT_GLOO));
}

// Two "nodes" on one host share /dev/shm and the PID namespace, so their
// memory domains match; direct writes must still stay inside a node.
TEST(RoutesTest, WorkersOnDifferentNodesNeverWriteEachOtherDirectly) {
  RouteEndpoint n0 = Endpoint("shm:boot", "GPU-0", {"GPU-0", "GPU-1", "GPU-2"});
  RouteEndpoint n0_peer = Endpoint("shm:boot", "GPU-1");
  RouteEndpoint n1 = Endpoint("shm:boot", "GPU-2");
  n0.node = n0_peer.node = "n0";
  n1.node = "n1";
  EXPECT_TRUE(CanPeerWrite(n0, n0_peer, v1::TRANSPORT_NCCL));
  EXPECT_FALSE(CanPeerWrite(n0, n1, v1::TRANSPORT_NCCL));
  EXPECT_FALSE(CanPeerWrite(n0, n1, v1::TRANSPORT_GLOO));
  n1.peer_gpus = {"GPU-0"};
  EXPECT_FALSE(CanPeerWrite(n1, n0, v1::TRANSPORT_GLOO));
  const std::vector<WorkerPair> eligible = {{0, 1}, {0, 2}, {2, 0}};
  EXPECT_THAT(ChoosePeerWrites(eligible, {n0, n0_peer, n1}, v1::TRANSPORT_GLOO),
              ElementsAre(WorkerPair(0, 1)));
}

TEST(RoutesTest, AReceiverWithUnmappableBuffersIsNeverWrittenDirectly) {
  // Its CUDA virtual memory came as the owner's descriptors: no peer maps it.
  RouteEndpoint vmm = Endpoint("n", "GPU-1");
  vmm.unmappable_buffers = true;
  const RouteEndpoint sender = Endpoint("n", "GPU-0", {"GPU-0", "GPU-1"});
  EXPECT_FALSE(CanPeerWrite(sender, vmm, v1::TRANSPORT_NCCL));
  // It still writes others directly (it reads its own sources).
  vmm.peer_gpus = {"GPU-0", "GPU-1"};
  EXPECT_TRUE(CanPeerWrite(vmm, Endpoint("n", "GPU-0"), v1::TRANSPORT_NCCL));
}

TEST(RoutesTest, OverNcclTheReceiversGpuMustBeAmongTheSendersPeers) {
  const RouteEndpoint sender = Endpoint("n", "GPU-0", {"GPU-0", "GPU-1"});
  EXPECT_TRUE(CanPeerWrite(sender, Endpoint("n", "GPU-1"), v1::TRANSPORT_NCCL));
  EXPECT_FALSE(CanPeerWrite(sender, Endpoint("n", "GPU-2"), v1::TRANSPORT_NCCL));
  EXPECT_FALSE(CanPeerWrite(sender, Endpoint("n", ""), v1::TRANSPORT_NCCL));
  // Over Gloo the GPUs do not matter (host memory).
  EXPECT_TRUE(CanPeerWrite(sender, Endpoint("n", "GPU-2"), v1::TRANSPORT_GLOO));
}

TEST(RoutesTest, ChoosePeerWritesKeepsConnectablePairsInOrder) {
  const std::vector<RouteEndpoint> endpoints = {Endpoint("a"), Endpoint("b"), Endpoint("a"),
                                                Endpoint("a")};
  const std::vector<WorkerPair> eligible = {{0, 1}, {0, 2}, {1, 2}, {2, 3}, {3, 7}};
  EXPECT_THAT(ChoosePeerWrites(eligible, endpoints, v1::TRANSPORT_GLOO),
              ElementsAre(WorkerPair(0, 2), WorkerPair(2, 3)));
}

TEST(RoutesTest, RoutesOfAWorkerAndTheirSignature) {
  const std::vector<WorkerPair> pairs = {{0, 2}, {1, 0}, {1, 2}, {2, 0}};
  const WorkerRoutes r0 = RoutesOf(pairs, 0);
  EXPECT_THAT(r0.write_to, ElementsAre(2));
  EXPECT_THAT(r0.written_by, ElementsAre(1, 2));
  EXPECT_EQ(r0.Signature(), "pw:to=2;by=1,2");
  EXPECT_TRUE(RoutesOf(pairs, 5).empty());
  EXPECT_EQ(RoutesOf(pairs, 5).Signature(), "");
}

TEST(RoutesTest, RoutePartMarksOnlyTheWorkersPeerWritePairs) {
  auto part = std::make_shared<v1::Plan>();
  AddBucket(part.get(), 0, 2);
  AddBucket(part.get(), 1, 0);
  AddBucket(part.get(), 0, 1);
  AddBucket(part.get(), 0, 0, 1, v1::TRANSPORT_LOCAL);
  const std::shared_ptr<const v1::Plan> same = part;
  EXPECT_EQ(RoutePart(same, 0, WorkerRoutes()), same) << "no routes: the part itself";
  WorkerRoutes routes;
  routes.write_to = {2};
  routes.written_by = {1};
  const std::shared_ptr<const v1::Plan> routed = RoutePart(same, 0, routes);
  ASSERT_NE(routed, same);
  std::vector<v1::BucketRoute> got;
  for (const v1::Bucket& b : routed->buckets()) got.push_back(b.route());
  EXPECT_THAT(got, ElementsAre(v1::ROUTE_PEER_WRITE, v1::ROUTE_PEER_WRITE, v1::ROUTE_TRANSPORT,
                               v1::ROUTE_TRANSPORT));
  for (const v1::Bucket& b : part->buckets()) EXPECT_EQ(b.route(), v1::ROUTE_TRANSPORT);
}

}  // namespace
}  // namespace wsync::plan
