// Direct writes (buckets routed ROUTE_PEER_WRITE, bound_plan.h DirectWrites): the sender writes a
// peer's destination buffers itself; the transport carries only ready and done tokens. Workers are
// threads of this process (Cluster), so a peer's registry is directly addressable, as a mapped shm
// object is in a worker.
#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cast.h"
#include "controller/plan/routes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/plan_builder.h"

namespace wsync::exec {
namespace {

using testing::Cluster;
using testing::kSentinel;
using testing::Piece;
using testing::PlanBuilder;
using testing::View;
constexpr BufferSide kSrc = BufferSide::kSource;
constexpr BufferSide kDst = BufferSide::kDestination;

float Value(int w, int64_t i) { return static_cast<float>(w * 1000 + i % 997) * 0.5f - 3.25f; }

// Two colocated workers swap row-parallel halves (strided on both sides,
// fp32 -> bf16 at the writer), a contiguous zero-copy half, and each copies
// its own half locally: the colocated FSDP -> TP pattern.
v1::Plan SwapPlan(int64_t rows, int64_t cols, int rounds) {
  PlanBuilder pb;
  const int64_t half = cols / 2;
  for (int w = 0; w < 2; ++w) {
    for (int r = 0; r < rounds; ++r) {
      const int64_t r0 = rows * r / rounds, n = rows * (r + 1) / rounds - r0;
      // My rows r0.., the peer's column half -> the peer's rows of my block.
      const int64_t src_col = (1 - w) * half;
      pb.AddBucket(w, 1 - w, r,
                   {Piece(View("m", (r0 * cols + src_col) * 4, {n, half}, v1::FP32, {cols, 1}),
                          View("m", ((w * rows + r0) * half) * 2, {n, half}, v1::BF16), v1::BF16)});
      pb.AddBucket(
          w, w, r,
          {Piece(View("m", (r0 * cols + w * half) * 4, {n, half}, v1::FP32, {cols, 1}),
                 View("m", ((w * rows + r0) * half) * 2 + 0, {n, half}, v1::BF16), v1::BF16)});
    }
    pb.AddBucket(w, 1 - w, 0,
                 {Piece(View("z", w * 512 * 2, {512}, v1::BF16),
                        View("z", w * 512 * 2, {512}, v1::BF16), v1::BF16)},
                 /*zero_copy=*/true);
  }
  return pb.Build();
}

void CheckSwap(Cluster& c, int64_t rows, int64_t cols) {
  const int64_t half = cols / 2;
  for (int w = 0; w < 2; ++w) {
    // Destination "m" of worker w: [2 * rows, half] = rows of worker 0, then
    // of worker 1, each restricted to w's column half.
    const uint16_t* d = c.Data<uint16_t>(w, kDst, "m");
    for (int from = 0; from < 2; ++from) {
      const float* s = c.Data<float>(from, kSrc, "m");
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < half; ++j) {
          ASSERT_EQ(d[(from * rows + i) * half + j], FloatToBf16(s[i * cols + w * half + j]))
              << "worker " << w << " rows of " << from << " (" << i << "," << j << ")";
        }
      }
    }
    const uint16_t* z = c.Data<uint16_t>(w, kDst, "z");
    const uint16_t* zs = c.Data<uint16_t>(1 - w, kSrc, "z");
    for (int64_t i = 0; i < 1024; ++i) {
      const bool written = i / 512 == 1 - w;
      if (written) {
        ASSERT_EQ(z[i], zs[i]) << "worker " << w << " z " << i;
      } else {
        ASSERT_EQ(z[i], kSentinel << 8 | kSentinel) << "worker " << w << " z " << i;
      }
    }
  }
}

void SetUpSwap(Cluster& c, int64_t rows, int64_t cols) {
  for (int w = 0; w < 2; ++w) {
    c.Add(w, kSrc, "m", v1::FP32, rows * cols);
    c.Add(w, kDst, "m", v1::BF16, 2 * rows * cols / 2);
    c.Add(w, kSrc, "z", v1::BF16, 1024);
    c.Add(w, kDst, "z", v1::BF16, 1024);
    float* s = c.Data<float>(w, kSrc, "m");
    for (int64_t i = 0; i < rows * cols; ++i) s[i] = Value(w, i);
    uint16_t* zs = c.Data<uint16_t>(w, kSrc, "z");
    for (int64_t i = 0; i < 1024; ++i) zs[i] = static_cast<uint16_t>(i * 31 + w + 1);
  }
}

// Worker 0's fp32 source "s" -> worker 1's destination "s" (n elements),
// one bucket.
v1::Plan OneBucket(Cluster& c, int64_t n) {
  c.Add(0, kSrc, "s", v1::FP32, n);
  c.Add(1, kDst, "s", v1::FP32, n);
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("s", 0, {n}, v1::FP32), View("s", 0, {n}, v1::FP32), v1::FP32)});
  return pb.Build();
}

// Every byte of worker 1's n-element fp32 destination `name` still holds
// its sentinel.
void ExpectUnwrittenBuffer(Cluster& c, const char* name, int64_t n = 64) {
  const uint8_t* d = c.Data<uint8_t>(1, kDst, name);
  for (int64_t i = 0; i < n * 4; ++i) {
    ASSERT_EQ(d[i], kSentinel) << name << " byte " << i << " written";
  }
}

// Every byte of worker 1's destination "s" still holds its sentinel.
void ExpectUnwritten(Cluster& c, int64_t n) { ExpectUnwrittenBuffer(c, "s", n); }

// The swap of SetUpSwap with both workers writing each other directly, each
// on `ops[w]` where given (null: the cluster's own data ops), connected.
absl::Status ConnectDirectSwap(Cluster& c, int64_t rows, int64_t cols,
                               std::array<DataOps*, 2> ops = {nullptr, nullptr},
                               ExecutorOptions options = {}) {
  SetUpSwap(c, rows, cols);
  for (int w = 0; w < 2; ++w) {
    if (ops[w] != nullptr) c.UseOps(w, ops[w]);
  }
  c.WriteDirectly(0, 1);
  c.WriteDirectly(1, 0);
  return c.Connect(options);
}

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

// The data ops never drain or finish puts while a transport round is in
// flight (device data ops free retired memory there, which would wait for
// NCCL's kernels: worker/backends/cuda/retired_memory.h), also when a round queued
// during the ready tokens fails; nor does the progress callback run there
// (the worker's reports over gRPC block).
class InFlightFlagTransport : public transport::Transport {
 public:
  InFlightFlagTransport(std::unique_ptr<transport::Transport> inner, std::atomic<bool>* flag)
      : inner_(std::move(inner)), flag_(flag) {}
  std::string Name() const override { return inner_->Name(); }
  transport::MemorySpace memory_space() const override { return inner_->memory_space(); }
  int32_t rank() const override { return inner_->rank(); }
  int32_t size() const override { return inner_->size(); }
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const transport::RoundHooks& hooks) override {
    flag_->store(true);
    absl::Status s = inner_->RunRound(sends, recvs, deadline, hooks);
    flag_->store(false);
    return s;
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  std::unique_ptr<transport::Transport> inner_;
  std::atomic<bool>* flag_;
};

class DrainWatch : public testing::LazyDataOps {
 public:
  explicit DrainWatch(const std::atomic<bool>* in_round) : in_round_(in_round) {}
  absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override {
    if (++copies_ == fail_copy) return absl::InternalError("copy refused at issue");
    return LazyDataOps::Copy(items, handle);
  }
  absl::Status Synchronize() override {
    if (in_round_->load()) ++drains_in_round;
    return LazyDataOps::Synchronize();
  }
  absl::Status Fence() override {
    if (in_round_->load()) ++drains_in_round;
    return LazyDataOps::Fence();
  }
  int fail_copy = -1;  // the Copy call (1-based) refused at issue
  int drains_in_round = 0;

 private:
  const std::atomic<bool>* in_round_;
  int copies_ = 0;
};

TEST(DirectWritesTest, DataOpsNeverDrainWhileARoundIsInFlight) {
  constexpr int64_t kRows = 96, kCols = 64;
  for (int fail_copy : {-1, 1, 2}) {
    SCOPED_TRACE(absl::StrCat("refused copy call ", fail_copy));
    Cluster c(2);
    std::atomic<bool> in_round[2] = {false, false};
    DrainWatch ops0(&in_round[0]), ops1(&in_round[1]);
    ops0.fail_copy = fail_copy;
    for (int w = 0; w < 2; ++w) {
      c.WrapTransport(w, [&in_round, w](std::unique_ptr<transport::Transport> t) {
        return std::make_unique<InFlightFlagTransport>(std::move(t), &in_round[w]);
      });
    }
    ExecutorOptions o;
    o.round_timeout = absl::Seconds(2);
    ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops0, &ops1}, o).ok());
    std::atomic<int> progress_calls{0}, progress_in_round{0};
    auto results = c.Run(SwapPlan(kRows, kCols, 3), absl::Seconds(30), {}, [&](const Progress& p) {
      ++progress_calls;
      if (in_round[p.worker].load()) ++progress_in_round;
    });
    EXPECT_EQ(results[0].ok(), fail_copy < 0) << results[0].status();
    if (fail_copy > 0) {
      EXPECT_NE(results[0].status().message().find("copy refused at issue"), std::string::npos)
          << results[0].status();
    }
    EXPECT_EQ(ops0.drains_in_round, 0);
    EXPECT_EQ(ops1.drains_in_round, 0);
    EXPECT_GT(progress_calls.load(), 0);
    EXPECT_EQ(progress_in_round.load(), 0) << "a progress callback (it may block) ran in a round";
  }
}

// A fault in local work queued without a wait (round 0 of three local-only
// rounds) surfaces at the last round; the error says since which round the
// work was queued.
TEST(DirectWritesTest, AFaultInQueuedLocalWorkNamesTheRoundItWasQueuedSince) {
  class FailingRoundZeroCopy : public testing::LazyDataOps {
   public:
    absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override {
      // Call 1 is round 0's copies (puts do not go through Copy here):
      // give it an item that fails when the queue runs it.
      if (++calls_ != 1 || items.empty()) return LazyDataOps::Copy(items, handle);
      std::vector<CopyItem> bad(items.begin(), items.end());
      bad[0].dst.shape[0] += 1;  // element counts differ
      return LazyDataOps::Copy(bad, handle);
    }

   private:
    int calls_ = 0;
  };
  constexpr int64_t kRows = 96, kCols = 64;
  Cluster c(2);
  FailingRoundZeroCopy ops[2];
  ASSERT_TRUE(ConnectDirectSwap(c, kRows, kCols, {&ops[0], &ops[1]}).ok());
  auto results = c.Run(SwapPlan(kRows, kCols, 3), absl::Seconds(30));
  for (int w = 0; w < 2; ++w) {
    ASSERT_FALSE(results[w].ok()) << "worker " << w;
    const std::string m(results[w].status().message());
    EXPECT_NE(m.find("round 2: finishing the round"), std::string::npos) << m;
    EXPECT_NE(m.find("local work queued since round 0"), std::string::npos) << m;
  }
}

// One direction direct, the other through the transport, in one sync.
TEST(DirectWritesTest, MixesWithTransportedBuckets) {
  constexpr int64_t kRows = 40, kCols = 32;
  Cluster c(2);
  SetUpSwap(c, kRows, kCols);
  c.WriteDirectly(1, 0);
  ASSERT_TRUE(c.Connect().ok());
  auto results = c.Run(SwapPlan(kRows, kCols, 2), absl::Seconds(30));
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->bytes_put, 0);
  EXPECT_GT(results[0]->bytes_put_into, 0);
  EXPECT_GT(results[1]->bytes_put, 0);
  EXPECT_GT(results[0]->peak_staging_bytes, 0);  // its sends still go staged
  CheckSwap(c, kRows, kCols);
}

// A receiver that never says it is ready is never written: the writer fails
// at the round deadline naming it, and the destination keeps its old bytes.
TEST(DirectWritesTest, NothingIsWrittenBeforeTheReceiverIsReady) {
  constexpr int64_t kN = 4096;
  Cluster c(2);
  const v1::Plan plan = OneBucket(c, kN);
  c.WriteDirectly(0, 1);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(1);
  ASSERT_TRUE(c.Connect(o).ok());
  const absl::Time start = absl::Now();
  auto results = c.Run(plan, absl::Seconds(60), /*silent=*/{1});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(results[0].ok());
  const absl::Status& s = results[0].status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("ready tokens"), std::string::npos) << s;
  EXPECT_NE(s.message().find("peer 1"), std::string::npos) << s;
  ExpectUnwritten(c, kN);
}

// A receiver whose owner registered again after the writer mapped its
// buffers sends another ready token: the writer writes nothing and fails.
TEST(DirectWritesTest, RefusesToWriteAReceiverThatRegisteredAgain) {
  constexpr int64_t kN = 1024;
  Cluster c(2);
  const v1::Plan plan = OneBucket(c, kN);
  c.WriteDirectly(0, 1);
  c.StaleMapping(0, 1);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(1);
  ASSERT_TRUE(c.Connect(o).ok());
  auto results = c.Run(plan, absl::Seconds(60));
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kAborted) << results[0].status();
  EXPECT_NE(results[0].status().message().find("worker 1's registered buffers differ"),
            std::string::npos)
      << results[0].status();
  ASSERT_FALSE(results[1].ok()) << "the receiver must not report success";
  ExpectUnwritten(c, kN);
}

// A receiver whose writer dies after the ready token fails at its deadline
// waiting for the done token, naming the writer.
TEST(DirectWritesTest, ReceiverFailsWhenTheWriterNeverFinishes) {
  Cluster c(2);
  const v1::Plan plan = OneBucket(c, 64);
  c.WriteDirectly(0, 1);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(1);
  ASSERT_TRUE(c.Connect(o).ok());
  auto results = c.Run(plan, absl::Seconds(60), /*silent=*/{0});
  ASSERT_FALSE(results[1].ok());
  // The ready token is sent (Gloo completes a send once buffered) or stalls;
  // either way the receiver ends at a deadline naming worker 0.
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kDeadlineExceeded) << results[1].status();
  EXPECT_NE(results[1].status().message().find("peer 0"), std::string::npos) << results[1].status();
}

// Pieces the receiver must process itself cannot be written directly: the
// binder refuses them on both sides, naming the bucket and piece.
// A device's put can fail only once it runs (a copy engine or kernel error);
// the data ops then name the item, and the interpreter names its tensor.
class FailingPutWriter : public HostPeerWriter {
 public:
  explicit FailingPutWriter(size_t bad_item) : bad_item_(bad_item) {}
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    if (bad_item_ < items.size()) {
      return ItemError(absl::InternalError("copy engine fault"), "put", bad_item_);
    }
    return HostPeerWriter::Put(items, handle, alone);
  }

 private:
  const size_t bad_item_;
};

TEST(DirectWritesTest, AFailedPutNamesItsTensor) {
  Cluster c(2);
  for (const char* name : {"a", "b"}) {
    c.Add(0, kSrc, name, v1::FP32, 64);
    c.Add(1, kDst, name, v1::FP32, 64);
  }
  PlanBuilder pb;
  pb.AddBucket(0, 1, 0,
               {Piece(View("a", 0, {64}, v1::FP32), View("a", 0, {64}, v1::FP32), v1::FP32),
                Piece(View("b", 0, {64}, v1::FP32), View("b", 0, {64}, v1::FP32), v1::FP32)});
  FailingPutWriter writer(/*bad_item=*/1);
  c.UseWriter(0, &writer);
  c.WriteDirectly(0, 1);
  ASSERT_TRUE(c.Connect().ok());
  auto results = c.Run(pb.Build(), absl::Seconds(3));
  ASSERT_FALSE(results[0].ok());
  const std::string msg(results[0].status().message());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInternal) << msg;
  EXPECT_NE(msg.find("direct writes to workers 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("piece 1 (tensor 'b')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("copy engine fault"), std::string::npos) << msg;
  // The receiver never gets its done token: it fails instead of reporting
  // bytes that were not written.
  EXPECT_FALSE(results[1].ok());
  ExpectUnwrittenBuffer(c, "b");
}

TEST(DirectWritesTest, RefusesReduceInputs) {
  constexpr int64_t kN = 100;
  Cluster c(2);
  for (int w = 0; w < 2; ++w) c.Add(w, kSrc, "p", v1::FP32, kN);
  c.Add(1, kDst, "p", v1::FP32, kN);
  PlanBuilder pb;
  const auto src = View("p", 0, {kN}, v1::FP32);
  const int64_t b0 = pb.AddBucket(0, 1, 0, {Piece(src, src, v1::FP32, /*reduce_id=*/1)});
  const int64_t b1 = pb.AddBucket(1, 1, 0, {Piece(src, src, v1::FP32, 1)});
  pb.AddReduce(1, 0, v1::REDUCE_SUM, v1::FP32, src, {{b0, 0}, {b1, 0}});
  v1::Plan plan = pb.Build();
  plan::MarkPeerWrites({{0, 1}}, &plan);  // a route the controller never picks
  DirectWrites writer;
  writer.peer_buffers[1] = &c.registry(1);
  auto bound = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost, &writer);
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bound.status().message().find("bucket 0"), std::string::npos) << bound.status();
  EXPECT_NE(bound.status().message().find("cannot be written directly"), std::string::npos)
      << bound.status();
  auto rbound = BindPlan(plan, 1, c.registry(1), MemorySpace::kHost, nullptr);
  ASSERT_FALSE(rbound.ok());
  EXPECT_NE(rbound.status().message().find("cannot be written directly"), std::string::npos)
      << rbound.status();
}

// The binder follows the plan's routes only: mapped peers turn no bucket
// into puts, and a route is taken bucket by bucket.
TEST(DirectWritesTest, BindsWhatThePlanRoutesNotWhatIsMapped) {
  Cluster c(2);
  c.Add(0, kSrc, "s", v1::FP32, 16);
  c.Add(1, kDst, "s", v1::FP32, 16);
  PlanBuilder pb;
  for (int64_t half = 0; half < 2; ++half) {
    const auto v = View("s", half * 32, {8}, v1::FP32);
    pb.AddBucket(0, 1, 0, {Piece(v, v, v1::FP32)});
  }
  v1::Plan plan = pb.Build();
  DirectWrites mapped;
  mapped.peer_buffers[1] = &c.registry(1);
  auto unrouted = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost, &mapped);
  ASSERT_TRUE(unrouted.ok()) << unrouted.status();
  EXPECT_TRUE((*unrouted)->puts.empty());
  EXPECT_TRUE((*unrouted)->direct_write_to.empty());
  ASSERT_EQ((*unrouted)->rounds.size(), 1u);
  EXPECT_EQ((*unrouted)->rounds[0].sends.size(), 2u);
  plan.mutable_buckets(1)->set_route(v1::ROUTE_PEER_WRITE);
  auto mixed = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost, &mapped);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ((*mixed)->puts.size(), 1u);
  EXPECT_EQ((*mixed)->bytes_put, 32);
  EXPECT_THAT((*mixed)->direct_write_to, ::testing::ElementsAre(1));
  ASSERT_EQ((*mixed)->rounds.size(), 1u);
  ASSERT_EQ((*mixed)->rounds[0].sends.size(), 1u);
  EXPECT_EQ((*mixed)->rounds[0].sends[0].bucket, 0);
}

TEST(DirectWritesTest, RefusesUnmappedPeerAndBadRoutes) {
  Cluster c(2);
  v1::Plan plan = OneBucket(c, 8);
  plan::MarkPeerWrites({{0, 1}}, &plan);
  DirectWrites unmapped;
  auto b = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost, &unmapped);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find("worker 1 are not mapped"), std::string::npos) << b.status();
  b = BindPlan(plan, 0, c.registry(0), MemorySpace::kHost, nullptr);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  // The receiver binds without any mapping: it runs nothing for the bucket.
  auto r = BindPlan(plan, 1, c.registry(1), MemorySpace::kHost, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)->direct_written_by, ::testing::ElementsAre(0));
  EXPECT_TRUE((*r)->direct_write_to.empty());
  EXPECT_GT((*r)->bytes_put_into, 0);
  // A local bucket is never peer-written.
  v1::Plan local = plan;
  local.mutable_buckets(0)->set_transport(v1::TRANSPORT_LOCAL);
  b = BindPlan(local, 0, c.registry(0), MemorySpace::kHost, &unmapped);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  // The peer's buffer too small for the planned view: named, with the peer.
  Cluster small(2);
  small.Add(0, kSrc, "s", v1::FP32, 8);
  small.Add(1, kDst, "s", v1::FP32, 4);
  DirectWrites w;
  w.peer_buffers[1] = &small.registry(1);
  b = BindPlan(plan, 0, small.registry(0), MemorySpace::kHost, &w);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kOutOfRange) << b.status();
  EXPECT_NE(b.status().message().find("of the peer"), std::string::npos) << b.status();
}

}  // namespace
}  // namespace wsync::exec
