// Direct writes (buckets routed ROUTE_PEER_WRITE, bound_plan.h DirectWrites): the sender writes a
// peer's destination buffers itself; the transport carries only ready and done tokens. Workers are
// threads of this process (Cluster), so a peer's registry is directly addressable, as a mapped shm
// object is in a worker. Faults, refusals and the rules of what may run
// during a round: direct_writes_faults_test.cc.
#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cast.h"
#include "controller/plan/routes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/direct_writes_fixture.h"
#include "tests/worker/exec/plan_builder.h"

namespace wsync::exec::direct_writes_testing {
namespace {

TEST(DirectWritesTest, BothDirectionsWriteEveryByteAndReplay) {
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  for (int run = 0; run < 2; ++run) {
    auto results = c.Run(plan, absl::Seconds(30));
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(results[w].ok())
          << "run " << run << " worker " << w << ": " << results[w].status();
      const int64_t net = kRows * kCols / 2 * 2 + 512 * 2;
      EXPECT_EQ(results[w]->bytes_put, net);
      EXPECT_EQ(results[w]->bytes_put_into, net);
      EXPECT_EQ(results[w]->bytes_sent, net);
      EXPECT_EQ(results[w]->bytes_received, net);
      EXPECT_EQ(results[w]->bytes_local, kRows * kCols / 2 * 2);
      EXPECT_EQ(results[w]->peak_staging_bytes, 0) << "direct writes need no staging";
    }
    CheckSwap(c, kRows, kCols);
  }
}

// With every cross-worker byte written directly, the rounds hold only local
// copies: the interpreter queues all of them (and the puts) and waits once,
// at the end, instead of draining the device between rounds.
TEST(DirectWritesTest, LocalOnlyRoundsQueueWithoutDrainingBetweenRounds) {
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  testing::LazyDataOps ops[2];
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops[0], &ops[1]}).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  auto results = c.Run(plan, absl::Seconds(30));
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w].status();
    EXPECT_EQ(results[w]->rounds.size(), 3u);
    EXPECT_EQ(results[w]->bytes_local, kRows * kCols / 2 * 2);
    EXPECT_EQ(ops[w].drains(), 1) << "worker " << w;
  }
  CheckSwap(c, kRows, kCols);
}

// Local-only rounds wait for no peer: up to early_local_rounds of them are
// queued while the ready tokens travel, before the puts, which must wait for
// those tokens; the rest follow the puts.
TEST(DirectWritesTest, LocalOnlyRoundsAreQueuedBeforeThePuts) {
  class CallOrder : public testing::LazyDataOps {
   public:
    absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override {
      calls.push_back("copy");
      return LazyDataOps::Copy(items, handle);
    }
    absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
      calls.push_back("put");
      return LazyDataOps::Put(items, handle, alone);
    }
    std::vector<std::string> calls;
  };
  constexpr int64_t kRows = 96, kCols = 64;
  const std::vector<std::string> one_early = {"copy", "put", "copy", "copy"};
  const std::vector<std::string> all_early = {"copy", "copy", "copy", "put"};
  const std::vector<std::string> none_early = {"put", "copy", "copy", "copy"};
  for (const auto& [early, expected] : std::vector<std::pair<int, std::vector<std::string>>>{
           {ExecutorOptions().early_local_rounds, one_early}, {-1, all_early}, {0, none_early}}) {
    Cluster c(2);
    CallOrder ops[2];
    ExecutorOptions o;
    o.early_local_rounds = early;
    ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops[0], &ops[1]}, o).ok());
    auto results = c.Run(SwapPlan(kRows, kCols, 3), absl::Seconds(30));
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w].status();
      EXPECT_EQ(ops[w].calls, expected) << "worker " << w << ", early_local_rounds " << early;
    }
    CheckSwap(c, kRows, kCols);
  }
}

// The executor prepares every round's copy list and the puts once per bound
// plan (ItemsHandle), so a device keys its cached tables by the handle
// instead of every item: a handle per list, the same ones on every replay of
// a plan, new ones when it is bound again.
TEST(DirectWritesTest, PreparesEachListOfABoundPlanOnce) {
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  testing::LazyDataOps ops[2];
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops[0], &ops[1]}).ok());
  const v1::Plan plan = SwapPlan(kRows, kCols, 3);
  std::set<uint64_t> seen;
  for (int sync = 0; sync < 2; ++sync) {
    ops[0].copy_handles.clear();
    ops[0].put_handles.clear();
    auto results = c.Run(plan, absl::Seconds(30));
    ASSERT_TRUE(results[0].ok()) << results[0].status();
    ASSERT_TRUE(results[1].ok()) << results[1].status();
    ASSERT_EQ(ops[0].copy_handles.size(), 3u);
    ASSERT_EQ(ops[0].put_handles.size(), 1u);
    EXPECT_NE(ops[0].put_handles[0].id, 0u);
    std::set<uint64_t> rounds;
    for (const ItemsHandle& h : ops[0].copy_handles) {
      EXPECT_NE(h.id, 0u);
      rounds.insert(h.id);
      // The cluster binds the plan again for every run: new handles.
      EXPECT_TRUE(seen.insert(h.id).second) << "copy handle " << h.id << " reused";
    }
    EXPECT_EQ(rounds.size(), 3u) << "one handle per round";
  }
  CheckSwap(c, kRows, kCols);
}

// A plan bound once and replayed keeps its handles.
TEST(DirectWritesTest, AReplayedPlanKeepsItsHandles) {
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  testing::LazyDataOps ops[2];
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops[0], &ops[1]}).ok());
  DirectWrites direct;
  direct.ready_token = 1000;
  direct.peer_buffers[1] = &c.registry(1);
  direct.expected_ready_tokens[1] = 1001;
  DirectWrites direct1;
  direct1.ready_token = 1001;
  direct1.peer_buffers[0] = &c.registry(0);
  direct1.expected_ready_tokens[0] = 1000;
  v1::Plan plan = SwapPlan(kRows, kCols, 3);
  plan::MarkPeerWrites({{0, 1}, {1, 0}}, &plan);
  auto b0 = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost, &direct);
  auto b1 = BindPlan(plan, 1, c.registry(1), MemorySpace::kHost, &direct1);
  ASSERT_TRUE(b0.ok()) << b0.status();
  ASSERT_TRUE(b1.ok()) << b1.status();
  std::vector<uint64_t> first;
  for (int sync = 0; sync < 2; ++sync) {
    ops[0].copy_handles.clear();
    ops[0].put_handles.clear();
    absl::StatusOr<SyncStats> r1;
    std::thread t1([&] {
      r1 = c.executor(1).Run(**b1, c.registry(1).generation(), absl::Now() + absl::Seconds(30));
    });
    auto r0 = c.executor(0).Run(**b0, c.registry(0).generation(), absl::Now() + absl::Seconds(30));
    t1.join();
    ASSERT_TRUE(r0.ok()) << r0.status();
    ASSERT_TRUE(r1.ok()) << r1.status();
    std::vector<uint64_t> ids;
    for (const ItemsHandle& h : ops[0].copy_handles) ids.push_back(h.id);
    ids.push_back(ops[0].put_handles.at(0).id);
    if (sync == 0) {
      first = ids;
    } else {
      EXPECT_EQ(ids, first);
    }
  }
  CheckSwap(c, kRows, kCols);
}

// Put phases (controller/plan/put_phases.h): a writer's puts follow its
// buckets' phases, each bucket's puts stay together and unchanged, and the
// sync writes the same bytes in any order.
TEST(DirectWritesTest, PutsFollowTheirBucketsPutPhases) {
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols).ok());
  DirectWrites direct;
  direct.ready_token = 1000;
  direct.peer_buffers[1] = &c.registry(1);
  direct.expected_ready_tokens[1] = 1001;
  const std::vector<plan::WorkerPair> pairs = {{0, 1}, {1, 0}};
  v1::Plan plain = SwapPlan(kRows, kCols, 3);
  plan::MarkPeerWrites(pairs, &plain);
  // Phases against round order: the last round's bucket first.
  std::vector<int32_t> phase(static_cast<size_t>(plain.buckets_size()), 0);
  for (const v1::Bucket& b : plain.buckets()) phase[b.id()] = 10 - b.round();
  v1::Plan phased = plain;
  plan::MarkPeerWrites(pairs, &phased, phase);
  auto b0 = BindPlan(plain, 0, c.registry(0), MemorySpace::kHost, &direct);
  auto p0 = BindPlan(phased, 0, c.registry(0), MemorySpace::kHost, &direct);
  ASSERT_TRUE(b0.ok()) << b0.status();
  ASSERT_TRUE(p0.ok()) << p0.status();
  ASSERT_EQ((*p0)->puts.size(), (*b0)->puts.size());
  std::map<int64_t, std::vector<void*>> before, after;  // bucket -> its puts' destinations
  std::vector<std::pair<int32_t, int32_t>> issue;       // (first put, phase) of sent buckets
  for (const auto& [bound, out] : {std::make_pair(*b0, &before), std::make_pair(*p0, &after)}) {
    for (const DirectBucket& d : bound->direct_buckets) {
      if (!d.sent) continue;
      for (int32_t i = 0; i < d.num_puts; ++i) {
        (*out)[d.bucket].push_back(bound->puts[d.first_put + i].dst.data);
      }
      if (bound == *p0) issue.push_back({d.first_put, d.put_phase});
    }
  }
  EXPECT_EQ(before, after);
  std::sort(issue.begin(), issue.end());
  ASSERT_GE(issue.size(), 3u);
  for (size_t k = 1; k < issue.size(); ++k) {
    EXPECT_LE(issue[k - 1].second, issue[k].second) << "put " << issue[k].first;
  }
  EXPECT_NE((*p0)->puts.front().dst.data, (*b0)->puts.front().dst.data)
      << "the phases reverse round order, so the first put changes";
  c.SetPutPhases(phase);
  for (int run = 0; run < 2; ++run) {
    auto results = c.Run(plain, absl::Seconds(30));
    for (int w = 0; w < 2; ++w) ASSERT_TRUE(results[w].ok()) << results[w].status();
    CheckSwap(c, kRows, kCols);
  }
}

// Local copies queued while the ready tokens travel: a silent receiver makes
// the ready round fail at its deadline, and the queued copies have run (the
// device drained) before the sync returns.
TEST(DirectWritesTest, ASilentReceiverFailsTheReadyRoundAfterQueuedLocalWorkRan) {
  class CountingCopies : public testing::LazyDataOps {
   public:
    absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override {
      ++copies;
      return LazyDataOps::Copy(items, handle);
    }
    int copies = 0;
  };
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  CountingCopies ops;
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(1);
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops, nullptr}, o).ok());
  auto results = c.Run(SwapPlan(kRows, kCols, 3), absl::Seconds(30), /*silent=*/{1});
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kDeadlineExceeded) << results[0].status();
  EXPECT_NE(results[0].status().message().find("ready tokens"), std::string::npos)
      << results[0].status();
  EXPECT_EQ(ops.copies, 1) << "the first local-only round was queued before the tokens arrived";
  EXPECT_EQ(ops.drains(), 1) << "the queued copies ran before the sync returned";
  EXPECT_EQ(c.executor(0).current_staging_bytes(), 0);
}

// An abort while the ready tokens travel, with local copies queued: the sync
// ends promptly with CANCELLED, after the queued copies ran.
TEST(DirectWritesTest, AnAbortDuringTheReadyRoundDrainsQueuedLocalWork) {
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  testing::LazyDataOps ops;
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops, nullptr}).ok());
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    c.executor(0).Abort("test abort");
  });
  const absl::Time start = absl::Now();
  auto results = c.Run(SwapPlan(kRows, kCols, 3), absl::Seconds(30), /*silent=*/{1});
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kCancelled) << results[0].status();
  EXPECT_EQ(ops.drains(), 1);
}
}  // namespace
}  // namespace wsync::exec::direct_writes_testing
