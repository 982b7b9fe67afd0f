// Direct-write mailboxes when a side fails (executor.h, PeerWriter's mailbox
// contract; host workers as threads of this process, Cluster): a writer
// that fails before its tokens or during its puts ends its receiver at once
// (a failure marker, not the round deadline); a failure after a done token
// was posted does not overwrite it (the receiver's part stands); a mailbox
// error of an aborted warm-up is CANCELLED.
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "controller/plan/routes.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/plan_builder.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec::testing {
namespace {
constexpr int64_t kN = 1024;

// Worker 0's fp32 "s" -> worker 1's "s", written directly.
v1::Plan OneWay(Cluster& c) {
  PlanBuilder pb;
  c.Add(0, kSrc, "s", v1::FP32, kN);
  c.Add(1, kDst, "s", v1::FP32, kN);
  pb.AddBucket(0, 1, 0,
               {Piece(View("s", 0, {kN}, v1::FP32), View("s", 0, {kN}, v1::FP32), v1::FP32)});
  c.WriteDirectly(0, 1);
  return pb.Build();
}

void Fill(Cluster& c, int run) {
  float* s = c.Data<float>(0, kSrc, "s");
  for (int64_t i = 0; i < kN; ++i) s[i] = static_cast<float>(run * 10000 + i);
}

bool Holds(Cluster& c, int run) {
  const float* d = c.Data<float>(1, kDst, "s");
  for (int64_t i = 0; i < kN; ++i) {
    if (d[i] != static_cast<float>(run * 10000 + i)) return false;
  }
  return true;
}

// A writer whose puts fail once armed.
class FailingPutWriter : public HostPeerWriter {
 public:
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    if (armed) return absl::InternalError("injected: the put engine failed");
    return HostPeerWriter::Put(items, handle, alone);
  }
  std::atomic<bool> armed{false};
};

// The writer fails its second sync before its tokens (its plan was bound
// against another registration) or during its puts: the receiver learns it
// through its mailbox at once, not at the 20 s round deadline.
TEST(DirectWritesMailboxFaultsTest, AWriterThatFailsBeforeOrDuringItsPutsEndsItsReceiverAtOnce) {
  for (const bool before_tokens : {true, false}) {
    SCOPED_TRACE(before_tokens ? "before the tokens" : "during the puts");
    Cluster c(2);
    const v1::Plan plan = OneWay(c);
    FailingPutWriter writer;
    c.UseWriter(0, &writer);
    ExecutorOptions o;
    o.round_timeout = absl::Seconds(20);
    ASSERT_TRUE(c.Connect(o).ok());
    Fill(c, 1);
    auto first = c.Run(plan, absl::Seconds(30));
    ASSERT_TRUE(first[0].ok() && first[1].ok()) << first[0].status() << first[1].status();
    ASSERT_TRUE(Holds(c, 1));
    if (before_tokens) {
      c.SkewGeneration(0);
    } else {
      writer.armed = true;
    }
    Fill(c, 2);
    const absl::Time start = absl::Now();
    auto results = c.Run(plan, absl::Seconds(60));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the receiver waited for its deadline";
    ASSERT_FALSE(results[0].ok());
    EXPECT_NE(results[0].status().message().find(before_tokens ? "registry generation"
                                                               : "injected: the put engine"),
              std::string::npos)
        << results[0].status();
    ASSERT_FALSE(results[1].ok());
    const absl::Status& s = results[1].status();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("peer 0 failed its part of sync sequence 2"), std::string::npos)
        << s;
  }
}

// Sets `posted` once it posted a done token (slot kSlotsPerPeer * w + kDone).
class DoneWatchingWriter : public HostPeerWriter {
 public:
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value) override {
    const absl::Status s = HostPeerWriter::Post(peer, slot, value);
    if (slot % exec::internal::kSlotsPerPeer == exec::internal::kDone) posted = true;
    return s;
  }
  std::atomic<bool> posted{false};
};

// Local work that fails once the writer posted its done token.
class FailsAfterDoneOps : public HostDataOps {
 public:
  explicit FailsAfterDoneOps(const std::atomic<bool>* done) : done_(done) {}
  absl::Status Synchronize() override {
    if (*done_) return absl::InternalError("injected: the local work failed");
    return absl::OkStatus();
  }

 private:
  const std::atomic<bool>* done_;
};

// A receiver slow to read its done token (its own work ran long).
class SlowDoneReader : public HostPeerWriter {
 public:
  absl::StatusOr<uint64_t> ReadMailbox(int64_t slot) override {
    if (slot % exec::internal::kSlotsPerPeer == exec::internal::kDone && !slept_) {
      slept_ = true;
      absl::SleepFor(absl::Milliseconds(300));
    }
    return HostPeerWriter::ReadMailbox(slot);
  }

 private:
  bool slept_ = false;
};

// The writer posts its done token (its puts were fenced: the receiver holds
// every byte), then its own local work fails. The receiver, reading its
// mailbox only later, still finds the done token: its part succeeded and
// the failure marker must not overwrite it.
TEST(DirectWritesMailboxFaultsTest, AFailureAfterTheDoneTokenLeavesTheReceiversPartStanding) {
  Cluster c(2);
  const v1::Plan plan = OneWay(c);
  DoneWatchingWriter writer;
  FailsAfterDoneOps ops(&writer.posted);
  SlowDoneReader reader;
  c.UseOps(0, &ops);
  c.UseWriter(0, &writer);
  c.UseWriter(1, &reader);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(20);
  ASSERT_TRUE(c.Connect(o).ok());
  Fill(c, 3);
  auto results = c.Run(plan, absl::Seconds(30));
  ASSERT_FALSE(results[0].ok());
  EXPECT_NE(results[0].status().message().find("injected: the local work failed"),
            std::string::npos)
      << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_TRUE(Holds(c, 3));
}

// Aborts its executor, then fails, when it opens a peer's mailbox: an abort
// landing during the warm-up's descriptor exchange.
class AbortingOpenWriter : public HostPeerWriter {
 public:
  absl::Status OpenPeerMailbox(int32_t peer, const std::string& descriptor) override {
    (void)peer;
    (void)descriptor;
    on_open();
    return absl::InternalError("injected: the peer's mailbox went away");
  }
  std::function<void()> on_open;
};

TEST(DirectWritesMailboxFaultsTest, AMailboxErrorOfAnAbortedWarmUpIsCancelled) {
  Cluster c(2);
  const v1::Plan plan = OneWay(c);
  AbortingOpenWriter writer;
  c.UseWriter(0, &writer);
  ASSERT_TRUE(c.Connect().ok());
  writer.on_open = [&c] { c.executor(0).Abort("the controller cancelled the warm-up"); };
  v1::Plan routed = plan;
  plan::MarkPeerWrites({{0, 1}}, &routed);
  std::vector<absl::Status> warm(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      DirectWrites direct;
      direct.ready_token = 1000 + w;
      if (w == 0) {
        direct.peer_buffers[1] = &c.registry(1);
        direct.expected_ready_tokens[1] = 1001;
      }
      auto bound = BindPlan(routed, w, c.registry(w), MemorySpace::kHost, &direct);
      if (!bound.ok()) {
        warm[w] = bound.status();
        return;
      }
      warm[w] = c.executor(w)
                    .WarmUp(**bound, c.registry(w).generation(), absl::Now() + absl::Seconds(30))
                    .status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(warm[0].code(), absl::StatusCode::kCancelled) << warm[0];
  EXPECT_NE(warm[0].message().find("aborted: the controller cancelled the warm-up"),
            std::string::npos)
      << warm[0];
  EXPECT_NE(warm[0].message().find("injected: the peer's mailbox went away"), std::string::npos)
      << warm[0];
}

}  // namespace
}  // namespace wsync::exec::testing
