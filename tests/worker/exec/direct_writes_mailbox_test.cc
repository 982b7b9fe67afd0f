// Direct-write tokens through peer mailboxes (executor.h, PeerWriter's
// mailbox contract) with host workers as threads of this process (Cluster):
// one descriptor exchange over the transport, then no transport round for
// tokens; a receiver ends only after its writer's puts were fenced; a
// re-registered receiver, a silent or aborted peer, a diverged sequence and
// a failed sync each end in a bounded, named error; mailbox_tokens off keeps
// the token rounds.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "controller/plan/routes.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/plan_builder.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec::testing {
namespace {

// Each worker's fp32 source "s" -> the other's destination "s" (n
// elements), one bucket each way; both write directly.
v1::Plan Exchange(Cluster& c, int64_t n) {
  PlanBuilder pb;
  for (int w = 0; w < 2; ++w) {
    c.Add(w, kSrc, "s", v1::FP32, n);
    c.Add(w, kDst, "s", v1::FP32, n);
    pb.AddBucket(w, 1 - w, 0,
                 {Piece(View("s", 0, {n}, v1::FP32), View("s", 0, {n}, v1::FP32), v1::FP32)});
  }
  c.WriteDirectly(0, 1);
  c.WriteDirectly(1, 0);
  return pb.Build();
}

void Fill(Cluster& c, int64_t n, int run) {
  for (int w = 0; w < 2; ++w) {
    float* s = c.Data<float>(w, kSrc, "s");
    for (int64_t i = 0; i < n; ++i) s[i] = static_cast<float>(run * 100000 + w * 10000 + i);
  }
}

void ExpectExchanged(Cluster& c, int64_t n, int run) {
  for (int w = 0; w < 2; ++w) {
    const float* d = c.Data<float>(w, kDst, "s");
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(d[i], static_cast<float>(run * 100000 + (1 - w) * 10000 + i))
          << "run " << run << " worker " << w << " element " << i;
    }
  }
}

// Counts the transport rounds a worker runs.
class CountingTransport : public transport::Transport {
 public:
  CountingTransport(std::unique_ptr<transport::Transport> inner, std::atomic<int>* rounds)
      : inner_(std::move(inner)), rounds_(rounds) {}
  std::string Name() const override { return inner_->Name(); }
  transport::MemorySpace memory_space() const override { return inner_->memory_space(); }
  int32_t rank() const override { return inner_->rank(); }
  int32_t size() const override { return inner_->size(); }
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const transport::RoundHooks& hooks) override {
    ++*rounds_;
    return inner_->RunRound(sends, recvs, deadline, hooks);
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  std::unique_ptr<transport::Transport> inner_;
  std::atomic<int>* rounds_;
};

// Many syncs in a row, both directions, fresh bytes each time: with
// mailboxes the first sync exchanges descriptors in one round and the
// others run no transport round at all; without, two token rounds a sync.
TEST(DirectWritesMailboxTest, ManySyncsRunNoTransportRoundAfterTheExchange) {
  constexpr int64_t kN = 2048;
  constexpr int kRuns = 40;
  for (const bool mailbox : {true, false}) {
    SCOPED_TRACE(mailbox ? "mailbox" : "token rounds");
    Cluster c(2);
    const v1::Plan plan = Exchange(c, kN);
    std::atomic<int> rounds[2] = {0, 0};
    for (int w = 0; w < 2; ++w) {
      c.WrapTransport(w, [&rounds, w](std::unique_ptr<transport::Transport> t) {
        return std::make_unique<CountingTransport>(std::move(t), &rounds[w]);
      });
    }
    ExecutorOptions o;
    o.mailbox_tokens = mailbox;
    ASSERT_TRUE(c.Connect(o).ok());
    for (int run = 0; run < kRuns; ++run) {
      Fill(c, kN, run);
      const int before = rounds[0].load();
      auto results = c.Run(plan, absl::Seconds(30));
      for (int w = 0; w < 2; ++w) {
        ASSERT_TRUE(results[w].ok())
            << "run " << run << " worker " << w << ": " << results[w].status();
        EXPECT_EQ(results[w]->bytes_put, kN * 4);
        EXPECT_EQ(results[w]->bytes_put_into, kN * 4);
        EXPECT_EQ(results[w]->mailbox_exchanged, mailbox && run == 0);
        if (mailbox) {
          EXPECT_GE(results[w]->mailbox_polls, 2) << "a ready and a done token at least";
        } else {
          EXPECT_EQ(results[w]->mailbox_polls, 0);
        }
      }
      ExpectExchanged(c, kN, run);
      EXPECT_EQ(rounds[0].load() - before, mailbox ? (run == 0 ? 1 : 0) : 2) << "run " << run;
    }
  }
}

// A writer whose puts complete only at its Fence, after a delay (as a
// device's asynchronous puts do): the receiver must not finish before the
// fence returned, and then holds every byte.
class SlowFenceWriter : public HostPeerWriter {
 public:
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    (void)handle;
    (void)alone;
    pending_.assign(items.begin(), items.end());
    return absl::OkStatus();
  }
  absl::Status Fence() override {
    if (pending_.empty()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(150));
    const absl::Status s = HostPeerWriter::Put(pending_, {}, false);
    pending_.clear();
    fenced_at = absl::Now();
    return s;
  }
  absl::Time fenced_at = absl::InfinitePast();

 private:
  std::vector<CopyItem> pending_;
};

TEST(DirectWritesMailboxTest, TheReceiverFinishesOnlyAfterTheWritersPutsWereFenced) {
  constexpr int64_t kN = 4096;
  Cluster c(2);
  PlanBuilder pb;
  c.Add(0, kSrc, "s", v1::FP32, kN);
  c.Add(1, kDst, "s", v1::FP32, kN);
  pb.AddBucket(0, 1, 0,
               {Piece(View("s", 0, {kN}, v1::FP32), View("s", 0, {kN}, v1::FP32), v1::FP32)});
  const v1::Plan plan = pb.Build();
  c.WriteDirectly(0, 1);
  SlowFenceWriter writer;
  c.UseWriter(0, &writer);
  ASSERT_TRUE(c.Connect().ok());
  for (int run = 0; run < 3; ++run) {
    float* s = c.Data<float>(0, kSrc, "s");
    for (int64_t i = 0; i < kN; ++i) s[i] = static_cast<float>(run * 7 + i);
    std::mutex mu;
    absl::Time receiver_done = absl::InfinitePast();
    bool bytes_ok = false;
    auto results = c.Run(plan, absl::Seconds(30), {}, [&](const Progress& p) {
      if (p.worker != 1 || p.round_index != Progress::kDirectWrites) return;
      std::lock_guard<std::mutex> lock(mu);
      receiver_done = absl::Now();
      const float* d = c.Data<float>(1, kDst, "s");
      bytes_ok = true;
      for (int64_t i = 0; i < kN; ++i)
        bytes_ok = bytes_ok && d[i] == static_cast<float>(run * 7 + i);
    });
    ASSERT_TRUE(results[0].ok()) << results[0].status();
    ASSERT_TRUE(results[1].ok()) << results[1].status();
    EXPECT_GE(receiver_done, writer.fenced_at) << "run " << run;
    EXPECT_TRUE(bytes_ok) << "run " << run << ": the receiver finished before every byte landed";
  }
}

// A receiver whose owner registered again: today's error at the writer, and
// the receiver learns it through its mailbox at once (not at its deadline).
TEST(DirectWritesMailboxTest, AReRegisteredReceiverIsRefusedAndLearnsItPromptly) {
  constexpr int64_t kN = 256;
  Cluster c(2);
  const v1::Plan plan = Exchange(c, kN);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(20);
  ASSERT_TRUE(c.Connect(o).ok());
  Fill(c, kN, 0);
  auto first = c.Run(plan, absl::Seconds(30));
  ASSERT_TRUE(first[0].ok() && first[1].ok());
  c.StaleMapping(0, 1);
  const absl::Time start = absl::Now();
  auto results = c.Run(plan, absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kAborted) << results[0].status();
  EXPECT_NE(results[0].status().message().find("worker 1's registered buffers differ"),
            std::string::npos)
      << results[0].status();
  ASSERT_FALSE(results[1].ok());
  EXPECT_NE(results[1].status().message().find("peer 0 failed its part"), std::string::npos)
      << results[1].status();
  // A failed sync leaves the sequences unknown: the executor refuses more.
  auto again = c.Run(plan, absl::Seconds(5));
  ASSERT_FALSE(again[0].ok());
  EXPECT_EQ(again[0].status().code(), absl::StatusCode::kFailedPrecondition) << again[0].status();
}

// After the exchange, a silent receiver fails its writer at the round
// deadline naming it, and an abort ends a poll promptly.
TEST(DirectWritesMailboxTest, ASilentOrAbortedPeerEndsThePollBounded) {
  constexpr int64_t kN = 256;
  for (const bool abort : {false, true}) {
    SCOPED_TRACE(abort ? "abort" : "deadline");
    Cluster c(2);
    const v1::Plan plan = Exchange(c, kN);
    ExecutorOptions o;
    o.round_timeout = abort ? absl::Seconds(60) : absl::Seconds(1);
    ASSERT_TRUE(c.Connect(o).ok());
    Fill(c, kN, 0);
    auto first = c.Run(plan, absl::Seconds(30));
    ASSERT_TRUE(first[0].ok() && first[1].ok());
    std::thread aborter;
    if (abort) {
      aborter = std::thread([&] {
        absl::SleepFor(absl::Milliseconds(300));
        c.executor(0).Abort("test abort");
      });
    }
    const absl::Time start = absl::Now();
    auto results = c.Run(plan, absl::Seconds(60), /*silent=*/{1});
    if (aborter.joinable()) aborter.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    ASSERT_FALSE(results[0].ok());
    const absl::Status& s = results[0].status();
    EXPECT_EQ(s.code(), abort ? absl::StatusCode::kCancelled : absl::StatusCode::kDeadlineExceeded)
        << s;
    EXPECT_NE(s.message().find("ready tokens"), std::string::npos) << s;
    if (!abort) {
      EXPECT_NE(s.message().find("peer 1"), std::string::npos) << s;
    }
  }
}

// A peer that posts a sequence this worker does not expect (its syncs
// diverged) is an error naming both sequences, not a hang, and the peer
// learns of the failure.
class SkewedSequenceWriter : public HostPeerWriter {
 public:
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value) override {
    // Slot 5w (executor.h): the ready sequence.
    const bool ready = slot % internal::kSlotsPerPeer == internal::kReadySeq;
    return HostPeerWriter::Post(peer, slot, ready ? value + 5 : value);
  }
};

TEST(DirectWritesMailboxTest, ASequenceFromAnotherSyncIsAnError) {
  constexpr int64_t kN = 256;
  Cluster c(2);
  const v1::Plan plan = Exchange(c, kN);
  SkewedSequenceWriter skewed;
  c.UseWriter(1, &skewed);
  ExecutorOptions o;
  o.round_timeout = absl::Seconds(20);
  ASSERT_TRUE(c.Connect(o).ok());
  Fill(c, kN, 0);
  const absl::Time start = absl::Now();
  auto results = c.Run(plan, absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(results[0].ok());
  const absl::Status& s = results[0].status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("peer 1 posted ready sequence 6 where this worker expects 1"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("a future sequence"), std::string::npos) << s;
  ASSERT_FALSE(results[1].ok()) << "worker 1 must not report success";
}

// Both workers' warm-ups of `plan` routed with direct writes each way
// (which exchanges the mailbox descriptors), in parallel; each one's status.
std::vector<absl::Status> WarmUpBoth(Cluster& c, const v1::Plan& plan) {
  v1::Plan routed = plan;
  plan::MarkPeerWrites({{0, 1}, {1, 0}}, &routed);
  std::vector<absl::Status> warm(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      DirectWrites direct;
      direct.ready_token = 1000 + w;
      direct.peer_buffers[1 - w] = &c.registry(1 - w);
      direct.expected_ready_tokens[1 - w] = 1000 + (1 - w);
      auto bound = BindPlan(routed, w, c.registry(w), MemorySpace::kHost, &direct);
      warm[w] = bound.ok() ? c.executor(w)
                                 .WarmUp(**bound, c.registry(w).generation(),
                                         absl::Now() + absl::Seconds(30))
                                 .status()
                           : bound.status();
    });
  }
  for (auto& t : threads) t.join();
  return warm;
}

// The warm-up exchanges the descriptors: the first sync then runs no
// transport round either.
TEST(DirectWritesMailboxTest, TheWarmUpExchangesTheDescriptors) {
  constexpr int64_t kN = 256;
  Cluster c(2);
  const v1::Plan plan = Exchange(c, kN);
  ASSERT_TRUE(c.Connect().ok());
  const std::vector<absl::Status> warm = WarmUpBoth(c, plan);
  ASSERT_TRUE(warm[0].ok()) << warm[0];
  ASSERT_TRUE(warm[1].ok()) << warm[1];
  Fill(c, kN, 3);
  auto results = c.Run(plan, absl::Seconds(30));
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(results[w].ok()) << results[w].status();
    EXPECT_FALSE(results[w]->mailbox_exchanged) << "worker " << w;
  }
  ExpectExchanged(c, kN, 3);
}

// This process's mailbox objects that still have a name in /dev/shm.
std::vector<std::string> MailboxNames() {
  std::vector<std::string> out;
  const std::string prefix = absl::StrCat("wsync-mbx-", getpid(), "-");
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) out.emplace_back(e->d_name);
  }
  closedir(dir);
  return out;
}

// Each peer gets a mailbox object of its own and unlinks its name once it
// mapped it: after the exchange (a first sync, or the warm-up) no name is
// left, so a worker killed from then on leaves nothing in /dev/shm; the
// tokens keep flowing through the mappings.
TEST(DirectWritesMailboxTest, NoMailboxNameOutlivesTheExchange) {
  constexpr int64_t kN = 256;
  for (const bool warm_up : {false, true}) {
    SCOPED_TRACE(warm_up ? "exchanged by the warm-up" : "exchanged by the first sync");
    Cluster c(2);
    const v1::Plan plan = Exchange(c, kN);
    ASSERT_TRUE(c.Connect().ok());
    if (warm_up) {
      const std::vector<absl::Status> warm = WarmUpBoth(c, plan);
      ASSERT_TRUE(warm[0].ok() && warm[1].ok()) << warm[0] << warm[1];
      EXPECT_EQ(MailboxNames(), std::vector<std::string>()) << "after the warm-up";
    }
    for (int run = 0; run < 3; ++run) {
      Fill(c, kN, run);
      auto results = c.Run(plan, absl::Seconds(30));
      ASSERT_TRUE(results[0].ok()) << results[0].status();
      ASSERT_TRUE(results[1].ok()) << results[1].status();
      ExpectExchanged(c, kN, run);
      EXPECT_EQ(MailboxNames(), std::vector<std::string>()) << "after sync " << run;
    }
  }
}

}  // namespace
}  // namespace wsync::exec::testing
