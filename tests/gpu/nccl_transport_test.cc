// NcclTransport with two ranks on two GPUs of this process (one thread each).
#include "worker/transport/nccl_transport.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>

#include "tests/gpu/gpu_test_util.h"

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
