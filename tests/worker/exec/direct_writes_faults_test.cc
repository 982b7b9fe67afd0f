// Direct writes (direct_writes_test.cc) when things go wrong: nothing
// drains while a transport round is in flight, faults in queued local work
// and in puts name where they came from, receivers that are not ready,
// registered again or never told done, and the binder's refusals.
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
#include "tests/worker/exec/direct_writes_fixture.h"
#include "tests/worker/exec/forwarding_transport.h"
#include "tests/worker/exec/plan_builder.h"

namespace wsync::exec::direct_writes_testing {
namespace {

using testing::ForwardingTransport;

// The data ops never drain or finish puts while a transport round is in
// flight (device data ops free retired memory there, which would wait for
// NCCL's kernels: worker/backends/cuda/retired_memory.h), also when a round queued
// during the ready tokens fails; nor does the progress callback run there
// (the worker's reports over gRPC block).
class InFlightFlagTransport : public ForwardingTransport {
 public:
  InFlightFlagTransport(std::unique_ptr<transport::Transport> inner, std::atomic<bool>* flag)
      : ForwardingTransport(std::move(inner)), flag_(flag) {}
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const transport::RoundHooks& hooks) override {
    flag_->store(true);
    absl::Status s = inner().RunRound(sends, recvs, deadline, hooks);
    flag_->store(false);
    return s;
  }

 private:
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
}  // namespace wsync::exec::direct_writes_testing
