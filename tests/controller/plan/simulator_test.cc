#include "controller/plan/simulator.h"

#include "gtest/gtest.h"

namespace wsync::plan {
namespace {

void AddBucket(v1::Plan* plan, int32_t sender, int32_t receiver, int32_t round, int64_t bytes) {
  v1::Bucket* b = plan->add_buckets();
  b->set_id(plan->buckets_size() - 1);
  b->set_sender(sender);
  b->set_receiver(receiver);
  b->set_round(round);
  b->set_bytes(bytes);
  b->set_transport(sender == receiver ? v1::TRANSPORT_LOCAL : v1::TRANSPORT_NETWORK);
}

v1::LinkModel Slow() {
  v1::LinkModel m;
  m.set_nvlink_bytes_per_second(100);
  m.set_nic_bytes_per_second(10);
  m.set_local_copy_bytes_per_second(1000);
  m.set_round_latency_seconds(1);
  return m;
}

// Workers 0 and 1 share node A, worker 2 is on node B.
WorkerNodes Nodes() { return {{0, "A"}, {1, "A"}, {2, "B"}}; }

v1::Plan TwoRounds() {
  v1::Plan plan;
  plan.set_num_rounds(2);
  AddBucket(&plan, 0, 1, 0, 200);  // NVLink: 2 s each side
  AddBucket(&plan, 0, 2, 0, 30);   // NIC: 3 s each side
  AddBucket(&plan, 1, 1, 0, 500);  // local copy: 0.5 s
  AddBucket(&plan, 2, 1, 1, 50);   // NIC: 5 s
  AddBucket(&plan, 2, 0, 1, 20);   // NIC: worker 2 sends 70 B = 7 s
  return plan;
}

TEST(SimulatorTest, RoundsAreBarriersWithLinksInParallel) {
  auto r = SimulatePlan(TwoRounds(), Nodes(), Slow());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->rounds.size(), 2u);
  // Round 0: worker 0 = max(NVLink out 2 s, NIC out 3 s); + 1 s latency.
  EXPECT_DOUBLE_EQ(r->rounds[0].seconds, 4.0);
  EXPECT_EQ(r->rounds[0].critical_worker, 0);
  // Round 1: worker 2's NIC egress 70 B / 10 = 7 s; + 1 s.
  EXPECT_DOUBLE_EQ(r->rounds[1].seconds, 8.0);
  EXPECT_EQ(r->rounds[1].critical_worker, 2);
  EXPECT_DOUBLE_EQ(r->makespan_seconds, 12.0);
}

TEST(SimulatorTest, LowerBoundIsBusiestLinkOverAllRounds) {
  auto r = SimulatePlan(TwoRounds(), Nodes(), Slow());
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->lower_bound_seconds, 7.0);  // worker 2: NIC out 70 B
  EXPECT_EQ(r->bound_worker, 2);
  EXPECT_EQ(r->bound_link, "nic_out");
  ASSERT_EQ(r->workers.size(), 3u);
  const WorkerLoad& w1 = r->workers[1];
  EXPECT_EQ(w1.worker, 1);
  EXPECT_EQ(w1.bytes.nvlink_in, 200);
  EXPECT_EQ(w1.bytes.nic_in, 50);
  EXPECT_EQ(w1.bytes.local, 500);
  EXPECT_EQ(w1.bytes.nvlink_out + w1.bytes.nic_out, 0);
  EXPECT_DOUBLE_EQ(w1.bound_seconds, 5.0);
  EXPECT_DOUBLE_EQ(w1.busy_seconds, 2.0 + 5.0);
  EXPECT_DOUBLE_EQ(r->workers[0].busy_seconds, 3.0 + 2.0);
  EXPECT_DOUBLE_EQ(r->workers[2].busy_seconds, 3.0 + 7.0);
  EXPECT_GE(r->makespan_seconds, r->lower_bound_seconds);
}

TEST(SimulatorTest, SameBytesOneRoundMeetsTheBound) {
  // Everything in one round without latency: makespan == bound.
  v1::Plan plan = TwoRounds();
  for (auto& b : *plan.mutable_buckets()) b.set_round(0);
  plan.set_num_rounds(1);
  v1::LinkModel m = Slow();
  m.set_round_latency_seconds(0);
  auto r = SimulatePlan(plan, Nodes(), m);
  ASSERT_TRUE(r.ok());
  // Worker 2: NIC in 30, NIC out 70 -> 7 s; worker 0: NIC out 30 + in 20 -> 3 s.
  EXPECT_DOUBLE_EQ(r->makespan_seconds, 7.0);
  EXPECT_DOUBLE_EQ(r->lower_bound_seconds, 7.0);
}

// NCCL forced onto its network transport (two "nodes" on one host): only
// the listed same-node pairs (direct writes) keep NVLink.
TEST(SimulatorTest, ForcedNetworkKeepsNvlinkOnlyForListedSameNodePairs) {
  v1::Plan plan;
  plan.set_num_rounds(1);
  AddBucket(&plan, 0, 1, 0, 200);  // same node, listed: NVLink 2 s
  AddBucket(&plan, 1, 0, 0, 30);   // same node, not listed: NIC 3 s
  AddBucket(&plan, 0, 2, 0, 20);   // listed but across nodes: NIC
  v1::LinkModel m = Slow();
  m.set_round_latency_seconds(0);
  const std::vector<std::pair<int32_t, int32_t>> direct = {{0, 1}, {0, 2}};
  SimulateOptions forced;
  forced.nvlink_pairs = &direct;
  auto r = SimulatePlan(plan, Nodes(), m, forced);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers.size(), 3u);
  EXPECT_EQ(r->workers[0].bytes.nvlink_out, 200);
  EXPECT_EQ(r->workers[0].bytes.nic_in, 30);
  EXPECT_EQ(r->workers[0].bytes.nic_out, 20);
  EXPECT_EQ(r->workers[1].bytes.nic_out, 30);
  // Worker 0: NIC in 30 B and out 20 B at 10 B/s -> 3 s; NVLink 2 s.
  EXPECT_DOUBLE_EQ(r->makespan_seconds, 3.0);
  // Without the option the 1 -> 0 bucket is NVLink: 2 s (NVLink 0 -> 1).
  auto plain = SimulatePlan(plan, Nodes(), m);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->workers[1].bytes.nvlink_out, 30);
  EXPECT_DOUBLE_EQ(plain->makespan_seconds, 2.0);
}

TEST(SimulatorTest, DefaultsForZeroLinkModel) {
  const LinkRates r = EffectiveRates(v1::LinkModel());
  EXPECT_DOUBLE_EQ(r.nvlink, 370e9);
  EXPECT_DOUBLE_EQ(r.nic, 50e9);
  EXPECT_DOUBLE_EQ(r.local, 2e12);
  EXPECT_DOUBLE_EQ(r.round_latency, 0);
  v1::Plan plan;
  plan.set_num_rounds(1);
  AddBucket(&plan, 0, 2, 0, 50'000'000'000);  // 50 GB over one NIC: 1 s
  auto s = SimulatePlan(plan, Nodes(), v1::LinkModel());
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->makespan_seconds, 1.0);
}

TEST(SimulatorTest, BadPlansAreErrors) {
  v1::Plan plan = TwoRounds();
  plan.mutable_buckets(3)->set_round(2);
  auto r = SimulatePlan(plan, Nodes(), Slow());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bucket 3"), std::string::npos) << r.status();

  plan = TwoRounds();
  AddBucket(&plan, 0, 7, 0, 1);
  r = SimulatePlan(plan, Nodes(), Slow());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("worker 7"), std::string::npos) << r.status();

  plan = TwoRounds();
  plan.mutable_buckets(0)->set_transport(v1::TRANSPORT_LOCAL);
  EXPECT_FALSE(SimulatePlan(plan, Nodes(), Slow()).ok());
  plan = TwoRounds();
  plan.mutable_buckets(2)->set_transport(v1::TRANSPORT_NETWORK);
  EXPECT_FALSE(SimulatePlan(plan, Nodes(), Slow()).ok());
  plan = TwoRounds();
  plan.set_num_rounds(2000000000);
  EXPECT_FALSE(SimulatePlan(plan, Nodes(), Slow()).ok());
  plan = TwoRounds();
  plan.mutable_buckets(1)->set_bytes(-5);
  EXPECT_FALSE(SimulatePlan(plan, Nodes(), Slow()).ok());
}

TEST(SimulatorTest, WorkerNodesFromSpec) {
  v1::TransferSpec spec;
  auto* a = spec.mutable_source()->add_ranks();
  a->set_worker(0);
  a->set_node("n0");
  auto* b = spec.mutable_destination()->add_ranks();
  b->set_worker(0);
  b->set_node("n0");
  auto* c = spec.mutable_destination()->add_ranks();
  c->set_worker(5);
  c->set_node("n1");
  auto nodes = WorkerNodesFromSpec(spec);
  ASSERT_TRUE(nodes.ok());
  EXPECT_EQ(nodes->size(), 2u);
  EXPECT_EQ(nodes->at(5), "n1");
  b->set_node("n2");
  EXPECT_FALSE(WorkerNodesFromSpec(spec).ok());
}

TEST(SimulatorTest, WorkerNodesFromPlan) {
  v1::Plan plan = TwoRounds();
  for (const auto& [w, node] : Nodes()) {
    v1::WorkerInfo* info = plan.add_workers();
    info->set_worker(w);
    info->set_node(node);
  }
  auto nodes = WorkerNodesFromPlan(plan);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  auto r = SimulatePlan(plan, *nodes, Slow());
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->makespan_seconds, 12.0);
  *plan.add_workers() = plan.workers(0);
  EXPECT_FALSE(WorkerNodesFromPlan(plan).ok());
}

}  // namespace
}  // namespace wsync::plan
