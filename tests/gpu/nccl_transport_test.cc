// NcclTransport with two ranks on two GPUs of this process (one thread each).
#include "worker/backends/cuda/nccl_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/cuda_data_ops.h"

namespace wsync::transport {
namespace {

using testing::FirstDiff;
using testing::TwinBuffer;

// Builds both ranks' transports concurrently (init needs every rank).
std::vector<std::unique_ptr<NcclTransport>> MakePair(absl::Duration init_timeout = absl::Seconds(60)) {
  auto id = NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  std::vector<std::unique_ptr<NcclTransport>> out(2);
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto t = NcclTransport::Create(*id, {.device = r, .rank = r, .size = 2,
                                           .init_timeout = init_timeout});
      st[r] = t.status();
      if (t.ok()) out[r] = std::move(*t);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(st[1].ok()) << st[1];
  return out;
}

void RunBoth(const std::function<absl::Status(int)>& fn, absl::Status* s0, absl::Status* s1) {
  std::thread t0([&] { *s0 = fn(0); });
  std::thread t1([&] { *s1 = fn(1); });
  t0.join();
  t1.join();
}

class NcclTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { WSYNC_REQUIRE_GPUS(2); }
};

TEST_F(NcclTransportTest, ExchangesManyTagsBothWaysWhateverTheListingOrder) {
  auto t = MakePair();
  ASSERT_TRUE(t[0] && t[1]);
  const std::vector<std::pair<int64_t, size_t>> tags = {{3, 1 << 20}, {1, 5}, {2, 64 << 20}, {9, 0}};
  std::vector<std::unique_ptr<TwinBuffer>> src[2], dst[2];
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < tags.size(); ++i) {
      src[r].push_back(std::make_unique<TwinBuffer>(r, tags[i].second + 1, 100 * r + i));
      dst[r].push_back(std::make_unique<TwinBuffer>(r, tags[i].second + 1, 1000 + 100 * r + i));
    }
  }
  absl::Status s0, s1;
  RunBoth(
      [&](int r) {
        std::vector<SendRequest> sends;
        std::vector<RecvRequest> recvs;
        for (size_t i = 0; i < tags.size(); ++i) {
          sends.push_back({1 - r, tags[i].first, src[r][i]->dev(), tags[i].second});
        }
        // Receives listed in reverse on purpose: matching is by tag.
        for (size_t k = tags.size(); k-- > 0;) {
          recvs.push_back({1 - r, tags[k].first, dst[r][k]->dev(), tags[k].second});
        }
        return t[r]->RunRound(sends, recvs, absl::Now() + absl::Seconds(30));
      },
      &s0, &s1);
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < tags.size(); ++i) {
      std::vector<uint8_t> got = dst[r][i]->Download();
      std::vector<uint8_t> want = dst[r][i]->host_bytes();
      std::copy(src[1 - r][i]->host(), src[1 - r][i]->host() + tags[i].second, want.begin());
      EXPECT_EQ(FirstDiff(got, want), -1) << "rank " << r << " tag " << tags[i].first;
    }
  }
}

TEST_F(NcclTransportTest, DeadPeerIsDeadlineExceededThenARebuiltCommunicatorWorks) {
  auto t = MakePair();
  ASSERT_TRUE(t[0] && t[1]);
  TwinBuffer a(0, 1 << 20, 1), b(1, 1 << 20, 2);
  const absl::Time start = absl::Now();
  absl::Status s = t[0]->RunRound({{1, 7, a.dev(), a.size()}}, {}, absl::Now() + absl::Seconds(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("peer 1"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  s = t[0]->RunRound({{1, 7, a.dev(), a.size()}}, {}, absl::Now() + absl::Seconds(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  t[1]->Abort("peer failed");  // what the controller does to the survivors
  t.clear();

  auto fresh = MakePair();
  ASSERT_TRUE(fresh[0] && fresh[1]);
  absl::Status s0, s1;
  RunBoth(
      [&](int r) {
        if (r == 0) return fresh[0]->RunRound({{1, 7, a.dev(), a.size()}}, {}, absl::Now() + absl::Seconds(30));
        return fresh[1]->RunRound({}, {{0, 7, b.dev(), b.size()}}, absl::Now() + absl::Seconds(30));
      },
      &s0, &s1);
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(FirstDiff(b.Download(), a.host_bytes()), -1);
}

// The executor queues local copies from on_posted while NCCL's kernel waits
// for the peer. On a first sync those calls allocate (cudaMalloc for tables
// and scratch, cudaMallocHost for uploads); none of that may wait for NCCL's
// kernel, or a dead peer would hold the worker past every deadline (the wait
// loop that aborts never runs again). CUDA documents allocations as possibly
// synchronizing; this checks what the driver here does (frees do wait, so
// the data ops never free there: retired_memory.h).
TEST_F(NcclTransportTest, AllocatingBesideADeadPeersRoundDoesNotWaitForIt) {
  auto t = MakePair();
  ASSERT_TRUE(t[0] && t[1]);
  TwinBuffer a(0, 1 << 20, 4), b(1, 1 << 20, 5);
  TwinBuffer src(0, 8 << 20, 6), dst(0, 8 << 20, 7);
  auto ops = cuda::CudaDataOps::Create({.device = 0});
  ASSERT_TRUE(ops.ok()) << ops.status();
  // One exchange first, both ways: a first transfer with a peer connects to
  // it, and a group waiting on a silent peer there never gets as far as
  // launching its kernel.
  TwinBuffer a2(0, 1 << 20, 8), b2(1, 1 << 20, 9);
  absl::Status w0, w1;
  RunBoth(
      [&](int r) {
        if (r == 0) {
          return t[0]->RunRound({{1, 7, a.dev(), a.size()}}, {{1, 7, a2.dev(), a2.size()}},
                                absl::Now() + absl::Seconds(30));
        }
        return t[1]->RunRound({{0, 7, b2.dev(), b2.size()}}, {{0, 7, b.dev(), b.size()}},
                              absl::Now() + absl::Seconds(30));
      },
      &w0, &w1);
  ASSERT_TRUE(w0.ok()) << w0;
  ASSERT_TRUE(w1.ok()) << w1;
  std::atomic<bool> posted_called{false}, posted_returned{false};
  absl::Duration posted_took;
  std::vector<absl::Duration> step_times;  // since on_posted began: malloc, pinned
  cuda::DeviceBuffer big;
  cuda::PinnedBuffer pinned;
  absl::Status posted_status;
  auto on_posted = [&] {
    posted_called = true;
    const absl::Time t0 = absl::Now();
    posted_status = [&]() -> absl::Status {
      // Freed after the round: cudaFree and cudaFreeHost do wait for the
      // device (the reason for retired_memory.h).
      auto device = cuda::DeviceBuffer::Allocate(0, size_t{512} << 20);
      if (!device.ok()) return device.status();
      big = std::move(*device);
      step_times.push_back(absl::Now() - t0);
      auto host = cuda::PinnedBuffer::Allocate(size_t{64} << 20);
      if (!host.ok()) return host.status();
      pinned = std::move(*host);
      step_times.push_back(absl::Now() - t0);
      // An uncached copy: its table is uploaded through fresh pinned and
      // device memory, and strided rows of different shapes need scratch.
      std::vector<exec::CopyItem> items;
      for (int i = 0; i < 64; ++i) {
        items.push_back({testing::View(src.dev(), i * 65536, v1::BF16, {64, 200}, {256, 1}),
                         testing::View(dst.dev(), i * 65536, v1::BF16, {200, 64}, {72, 1})});
      }
      return (*ops)->Copy(items);
    }();
    posted_took = absl::Now() - t0;
    posted_returned = true;
  };
  // If on_posted blocks behind the spinning kernel, rank 1 posts its side
  // after 10 s so the test ends (and fails) instead of hanging.
  std::atomic<bool> done{false};
  std::thread rescue([&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!done.load() && !posted_returned.load() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (!posted_returned.load()) {
      t[1]->RunRound({{0, 8, b2.dev(), b2.size()}}, {}, absl::Now() + absl::Seconds(5))
          .IgnoreError();
    }
  });
  // A receive: unlike a send, it cannot complete into NCCL's buffers.
  const absl::Time start = absl::Now();
  absl::Status s =
      t[0]->RunRound({}, {{1, 8, a2.dev(), a2.size()}}, absl::Now() + absl::Seconds(3), on_posted);
  done = true;
  rescue.join();
  ASSERT_TRUE(posted_called.load()) << s;
  EXPECT_TRUE(posted_returned.load()) << "work issued beside NCCL's kernel waited for it";
  EXPECT_LT(posted_took, absl::Seconds(2))
      << "work issued beside NCCL's kernel waited for it (cudaMalloc done after "
      << (step_times.size() > 0 ? absl::FormatDuration(step_times[0]) : "never")
      << ", cudaMallocHost after "
      << (step_times.size() > 1 ? absl::FormatDuration(step_times[1]) : "never") << ")";
  EXPECT_TRUE(posted_status.ok()) << posted_status;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  t[1]->Abort("peer failed");
  // The copy queued beside the dead round ran once the communicator was
  // aborted.
  ASSERT_TRUE((*ops)->Synchronize().ok());
}

TEST_F(NcclTransportTest, AbortFromAnotherThreadCancelsTheRound) {
  auto t = MakePair();
  ASSERT_TRUE(t[0] && t[1]);
  TwinBuffer a(0, 1 << 20, 3);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    t[0]->Abort("operator abort");
  });
  const absl::Time start = absl::Now();
  absl::Status s = t[0]->RunRound({}, {{1, 1, a.dev(), a.size()}}, absl::Now() + absl::Seconds(60));
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  s = t[0]->RunRound({}, {{1, 1, a.dev(), a.size()}}, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  t[1]->Abort("peer cancelled");
}

TEST_F(NcclTransportTest, InvalidRequestsAreRejectedBeforeCommunicating) {
  auto t = MakePair();
  ASSERT_TRUE(t[0] && t[1]);
  TwinBuffer a(0, 4096, 4);
  const absl::Time d = absl::Now() + absl::Seconds(5);
  EXPECT_EQ(t[0]->RunRound({{0, 1, a.dev(), 16}}, {}, d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t[0]->RunRound({{2, 1, a.dev(), 16}}, {}, d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t[0]->RunRound({{1, 1, nullptr, 16}}, {}, d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t[0]->RunRound({}, {{1, 4, a.dev(), 16}, {1, 4, a.dev(), 16}}, d).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t[0]->RunRound({{1, 1, nullptr, 0}}, {}, d).ok()) << "zero bytes need no peer";
}

TEST_F(NcclTransportTest, MissingRankIsAnInitDeadline) {
  auto id = NewUniqueId();
  ASSERT_TRUE(id.ok());
  const absl::Time start = absl::Now();
  auto t = NcclTransport::Create(*id, {.device = 0, .rank = 0, .size = 2,
                                       .init_timeout = absl::Seconds(3)});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

}  // namespace
}  // namespace wsync::transport
