// Phase gates (worker/exec/phase_gates.h): the ranges a bound plan's puts
// form by phase, and real executors on the host backend whose writers gate
// between phases: each worker's issue order, every gate opened by its
// peer's signal (none by its timeout), a peer that never signals costing
// only the timeout, and gates off.
#include "worker/exec/phase_gates.h"

#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/exec/direct_writes_fixture.h"
#include "worker/backends/host/host_peer_writer.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {
namespace {

using direct_writes_testing::CheckSwap;
using direct_writes_testing::ConnectDirectSwap;
using direct_writes_testing::SwapPlan;
using testing::Cluster;

// A plan of `phases.size()` sent buckets, bucket k with phases[k] and
// sizes[k] puts, laid out in bucket order.
BoundPlan PlanOf(const std::vector<int32_t>& phases, const std::vector<int32_t>& sizes) {
  BoundPlan p;
  int32_t next = 0;
  for (size_t k = 0; k < phases.size(); ++k) {
    DirectBucket d;
    d.bucket = static_cast<int64_t>(k);
    d.sent = true;
    d.put_phase = phases[k];
    d.first_put = next;
    d.num_puts = sizes[k];
    next += sizes[k];
    p.direct_buckets.push_back(d);
  }
  p.puts.resize(static_cast<size_t>(next));
  return p;
}

TEST(PhaseGatesTest, OneRangePerPhaseInPhaseOrder) {
  PhaseGates g;
  g.Prepare(PlanOf({0, 0, 2, 5, 5}, {1, 2, 3, 1, 0}), nullptr);
  EXPECT_EQ(g.num_ranges(), 3u) << "phases 0, 2 and 5";
  g.Prepare(PlanOf({3}, {4}), nullptr);
  EXPECT_EQ(g.num_ranges(), 1u);
  g.Prepare(PlanOf({}, {}), nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "a receiver only";
}

TEST(PhaseGatesTest, PlansThatCannotBeGatedGetNoRanges) {
  PhaseGates g;
  g.Prepare(PlanOf({0, 1, 0}, {1, 1, 1}), nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "phase 0's puts are not one range";
  g.Prepare(PlanOf({1, 0}, {1, 1}), nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "phases out of order in plan.puts";
  g.Prepare(PlanOf({0, -1}, {1, 1}), nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "a negative phase";
  g.Prepare(PlanOf({0, static_cast<int32_t>(PhaseGates::kAllPhases)}, {1, 1}), nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "a phase that collides with kAllPhases";
  BoundPlan outside = PlanOf({0, 1}, {1, 1});
  outside.direct_buckets[1].first_put = 7;
  g.Prepare(outside, nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "puts outside plan.puts";
  BoundPlan uncovered = PlanOf({0, 1}, {1, 1});
  uncovered.puts.resize(3);
  g.Prepare(uncovered, nullptr);
  EXPECT_EQ(g.num_ranges(), 0u) << "a put no sent bucket names";
}

TEST(PhaseGatesTest, ValuesGrowWithTheSequenceAndThePhase) {
  EXPECT_LT(PhaseGates::Value(1, PhaseGates::kAllPhases), PhaseGates::Value(2, 0));
  EXPECT_LT(PhaseGates::Value(5, 3), PhaseGates::Value(5, 4));
  EXPECT_GE((uint64_t{1} << 63) | 1, PhaseGates::Value(uint64_t{1} << 40, 7))
      << "a failure marker opens every gate";
}

// A host writer that logs its gates, signals and puts ("G<phase>", "S<phase>",
// "P<items>"), and optionally never signals (a silent peer).
class LoggingWriter : public HostPeerWriter {
 public:
  explicit LoggingWriter(bool silent = false) : silent_(silent) {}
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    Log(absl::StrCat("P", items.size()));
    return HostPeerWriter::Put(items, handle, alone);
  }
  absl::Status SignalAfterPuts(absl::Span<const GatePost> posts) override {
    for (const GatePost& p : posts) Log(absl::StrCat("S", p.value & PhaseGates::kAllPhases));
    if (silent_) return Fence();
    return HostPeerWriter::SignalAfterPuts(posts);
  }
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value) override {
    if (silent_ && slot % internal::kSlotsPerPeer == internal::kPhase) return absl::OkStatus();
    return HostPeerWriter::Post(peer, slot, value);
  }
  absl::Status GatePuts(absl::Span<const GateWait> waits, absl::Duration timeout) override {
    for (const GateWait& w : waits) Log(absl::StrCat("G", w.at_least & PhaseGates::kAllPhases));
    return HostPeerWriter::GatePuts(waits, timeout);
  }
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

 private:
  void Log(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back(std::move(e));
  }
  const bool silent_;
  std::mutex mu_;
  std::vector<std::string> log_;
};

constexpr int64_t kRows = 96, kCols = 64;

// Phases against round order (8, 9, 10 for rounds 2, 1, 0), as
// DirectWritesTest.PutsFollowTheirBucketsPutPhases.
std::vector<int32_t> ReversedPhases(const v1::Plan& plan) {
  std::vector<int32_t> phase(static_cast<size_t>(plan.buckets_size()), 0);
  for (const v1::Bucket& b : plan.buckets()) phase[b.id()] = 10 - b.round();
  return phase;
}

TEST(PhaseGatesTest, EveryGateOpensByItsPeersSignalInPhaseOrder) {
  Cluster c(2);
  LoggingWriter writers[2];
  for (int w = 0; w < 2; ++w) c.UseWriter(w, &writers[w]);
  ExecutorOptions o;
  o.put_gate_timeout = absl::Seconds(20);
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {nullptr, nullptr}, o).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  c.SetPutPhases(ReversedPhases(plan));
  for (int run = 0; run < 2; ++run) {
    const absl::Time start = absl::Now();
    auto results = c.Run(plan, absl::Seconds(60));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "no gate waited for its timeout";
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(results[w].ok()) << results[w].status();
      EXPECT_EQ(results[w]->put_gates, 3) << "worker " << w << ": phases 8, 9 and 10";
      EXPECT_EQ(results[w]->put_gates_timed_out, 0) << "worker " << w;
    }
    CheckSwap(c, kRows, kCols);
  }
  // Per sync: phase 8 signalled first (nothing below it), then per phase a
  // gate, the puts (zero-copy and strided buckets of round 0 in phase 10),
  // the next phase's signal.
  const std::vector<std::string> want = {"S8", "G8",  "P1",  "S9", "G9",
                                         "P1", "S10", "G10", "P2", "S65535"};
  for (int w = 0; w < 2; ++w) {
    const std::vector<std::string> log = writers[w].log();
    ASSERT_EQ(log.size(), 2 * want.size()) << "worker " << w;
    for (size_t k = 0; k < log.size(); ++k) {
      EXPECT_EQ(log[k], want[k % want.size()]) << "worker " << w << " event " << k;
    }
  }
}

TEST(PhaseGatesTest, APeerThatNeverSignalsCostsOnlyTheTimeoutAndTheBytesStayRight) {
  Cluster c(2);
  LoggingWriter waiting, silent(/*silent=*/true);
  c.UseWriter(0, &waiting);
  c.UseWriter(1, &silent);
  ExecutorOptions o;
  o.put_gate_timeout = absl::Milliseconds(150);
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {nullptr, nullptr}, o).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  c.SetPutPhases(ReversedPhases(plan));
  const absl::Time start = absl::Now();
  auto results = c.Run(plan, absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(results[w].ok()) << results[w].status();
  EXPECT_EQ(results[0]->put_gates_timed_out, 3) << "each of worker 0's gates timed out";
  // Worker 1's gates may time out too: worker 0 signals each phase only
  // after its own gate's timeout.
  EXPECT_GE(took, absl::Milliseconds(3 * 150));
  EXPECT_LT(took, absl::Seconds(10));
  CheckSwap(c, kRows, kCols);
}

TEST(PhaseGatesTest, GatesOffIssueEveryPutAtOnceAndTellThePeers) {
  Cluster c(2);
  LoggingWriter writers[2];
  for (int w = 0; w < 2; ++w) c.UseWriter(w, &writers[w]);
  ExecutorOptions o;
  o.put_phase_gates = false;
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {nullptr, nullptr}, o).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  c.SetPutPhases(ReversedPhases(plan));
  auto results = c.Run(plan, absl::Seconds(60));
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(results[w].ok()) << results[w].status();
    EXPECT_EQ(results[w]->put_gates, 0);
    EXPECT_EQ(writers[w].log(), std::vector<std::string>{"P4"}) << "one call, no gate";
  }
  CheckSwap(c, kRows, kCols);
}

// Phases the gates cannot follow (here one outside [0, kAllPhases)): every
// put still goes, at once, without gates.
TEST(PhaseGatesTest, PhasesTheGatesCannotFollowPutEverythingWithoutGates) {
  for (int32_t odd : {-1, static_cast<int32_t>(PhaseGates::kAllPhases)}) {
    Cluster c(2);
    LoggingWriter writers[2];
    for (int w = 0; w < 2; ++w) c.UseWriter(w, &writers[w]);
    ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols).ok());
    const v1::Plan plan = SwapPlan(kRows, kCols, 3);
    std::vector<int32_t> phases = ReversedPhases(plan);
    phases[0] = odd;
    c.SetPutPhases(phases);
    auto results = c.Run(plan, absl::Seconds(60));
    for (int w = 0; w < 2; ++w) ASSERT_TRUE(results[w].ok()) << results[w].status();
    EXPECT_EQ(results[0]->put_gates, 0) << "phase " << odd;
    EXPECT_EQ(writers[0].log(), std::vector<std::string>{"P4"}) << "phase " << odd;
    // Worker 1 gates on worker 0, who posted "all phases" at once.
    EXPECT_EQ(results[1]->put_gates, 3) << "phase " << odd;
    EXPECT_EQ(results[1]->put_gates_timed_out, 0) << "phase " << odd;
    CheckSwap(c, kRows, kCols);
  }
}

}  // namespace
}  // namespace wsync::exec
