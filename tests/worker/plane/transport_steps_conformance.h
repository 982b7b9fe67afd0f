// The transport conformance suite's tests of steps inside a round
// (transport.h, RunRound "Steps"). Included beside transport_conformance.h
// by every backend's test binary, so each instantiation runs them too.
#ifndef WSYNC_TESTS_WORKER_PLANE_TRANSPORT_STEPS_CONFORMANCE_H_
#define WSYNC_TESTS_WORKER_PLANE_TRANSPORT_STEPS_CONFORMANCE_H_

#include <memory>
#include <vector>

#include "tests/worker/plane/transport_conformance.h"

namespace wsync::transport::conformance {

// A chain 0 -> 1 -> 2 within one round: rank 0 sends chunk k in step k,
// rank 1 receives it in step k and forwards the same memory in step k + 1,
// rank 2 receives it then. Rank 1's memory starts with other bytes, so a
// transport that ran a forward before its chunk arrived delivers those.
TEST_P(TransportConformanceTest, StepsRelayWithinOneRound) {
  if (factory().max_group_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  constexpr int kChunks = 4;
  constexpr size_t kBytes = size_t{1} << 20;
  auto group = Group(3);
  ASSERT_EQ(group.size(), 3u);
  std::vector<std::shared_ptr<uint8_t>> src, mid, dst;
  for (int k = 0; k < kChunks; ++k) {
    src.push_back(Filled(0, 500 + k, kBytes));
    mid.push_back(Filled(1, 900 + k, kBytes));  // stale bytes, overwritten in step k
    dst.push_back(factory().Allocate(2, kBytes));
  }
  auto st = OnRanks(3, [&](int r) {
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    for (int k = 0; k < kChunks; ++k) {
      if (r == 0) sends.push_back({1, k, src[k].get(), kBytes, k});
      if (r == 1) {
        recvs.push_back({0, k, mid[k].get(), kBytes, k});
        sends.push_back({2, 100 + k, mid[k].get(), kBytes, k + 1});
      }
      if (r == 2) recvs.push_back({1, 100 + k, dst[k].get(), kBytes, k + 1});
    }
    return group[r]->RunRound(sends, recvs, In(absl::Seconds(60)));
  });
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  for (int k = 0; k < kChunks; ++k) {
    EXPECT_TRUE(Holds(1, mid[k].get(), 500 + k, kBytes)) << "chunk " << k << " on rank 1";
    EXPECT_TRUE(Holds(2, dst[k].get(), 500 + k, kBytes)) << "chunk " << k << " on rank 2";
  }
}

// The same relay on two ranks, both ways at once: rank 0 sends chunk k to
// rank 1 in step 2k, rank 1 sends it back from the memory it landed in, in
// step 2k + 1; rank 1 sends its own chunk k to rank 0 in step 2k as well,
// and rank 0 returns it likewise. Runs where only two ranks (GPUs) exist,
// without landing parts and with each step's lists cut into parts.
TEST_P(TransportConformanceTest, StepsRelayBackWithinOneRound) {
  constexpr int kChunks = 4;
  constexpr size_t kBytes = size_t{1} << 20;
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  RoundHooks parts;
  parts.max_landing_parts = 4;
  parts.min_landing_part_bytes = 64 << 10;
  for (const RoundHooks& hooks : {RoundHooks{}, parts}) {
    SCOPED_TRACE(hooks.max_landing_parts > 1 ? "landing parts" : "one part");
    // own[r][k]: rank r's chunk k; landed[r][k]: where the peer's chunk k
    // lands on rank r (stale bytes first); back[r][k]: own[r][k] returned.
    std::vector<std::shared_ptr<uint8_t>> own[2], landed[2], back[2];
    for (int r = 0; r < 2; ++r) {
      for (int k = 0; k < kChunks; ++k) {
        own[r].push_back(Filled(r, 300 + 10 * r + k, kBytes));
        landed[r].push_back(Filled(r, 800 + 10 * r + k, kBytes));
        back[r].push_back(factory().Allocate(r, kBytes));
      }
    }
    // Each chunk moves as kQuarters buckets, so that landing parts cut a
    // step's lists; tag = 1000 * hop + 100 * the chunk's owner + 10 * k + q.
    constexpr int kQuarters = 4;
    constexpr size_t kQuarter = kBytes / kQuarters;
    auto st = OnRanks(2, [&](int r) {
      const int peer = 1 - r;
      std::vector<SendRequest> sends;
      std::vector<RecvRequest> recvs;
      for (int k = 0; k < kChunks; ++k) {
        for (int q = 0; q < kQuarters; ++q) {
          const size_t at = q * kQuarter;
          const int mine = 100 * r + 10 * k + q, theirs = 100 * peer + 10 * k + q;
          sends.push_back({peer, mine, own[r][k].get() + at, kQuarter, 2 * k});
          recvs.push_back({peer, theirs, landed[r][k].get() + at, kQuarter, 2 * k});
          sends.push_back({peer, 1000 + theirs, landed[r][k].get() + at, kQuarter, 2 * k + 1});
          recvs.push_back({peer, 1000 + mine, back[r][k].get() + at, kQuarter, 2 * k + 1});
        }
      }
      return group[r]->RunRound(sends, recvs, In(absl::Seconds(60)), hooks);
    });
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    for (int r = 0; r < 2; ++r) {
      for (int k = 0; k < kChunks; ++k) {
        EXPECT_TRUE(Holds(r, landed[r][k].get(), 300 + 10 * (1 - r) + k, kBytes))
            << "rank " << r << " chunk " << k << " landed";
        EXPECT_TRUE(Holds(r, back[r][k].get(), 300 + 10 * r + k, kBytes))
            << "rank " << r << " chunk " << k << " returned";
      }
    }
  }
}

// A receive of a later step may overwrite what a send of an earlier step
// read: rank 0 sends its buffer in step 0 and receives new bytes into it in
// step 1; rank 1 gets the old bytes.
TEST_P(TransportConformanceTest, StepsReuseMemoryAfterAnEarlierStepSentIt) {
  constexpr size_t kBytes = size_t{1} << 20;
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  auto shared = Filled(0, 31, kBytes);
  auto fresh = Filled(1, 32, kBytes);
  auto got = factory().Allocate(1, kBytes);
  auto st = OnRanks(2, [&](int r) {
    if (r == 0) {
      SendRequest s{1, 1, shared.get(), kBytes, 0};
      RecvRequest q{1, 2, shared.get(), kBytes, 1};
      return group[0]->RunRound({&s, 1}, {&q, 1}, In(absl::Seconds(60)));
    }
    SendRequest s{0, 2, fresh.get(), kBytes, 1};
    RecvRequest q{0, 1, got.get(), kBytes, 0};
    return group[1]->RunRound({&s, 1}, {&q, 1}, In(absl::Seconds(60)));
  });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  EXPECT_TRUE(Holds(1, got.get(), 31, kBytes)) << "rank 1 got the bytes of a later step";
  EXPECT_TRUE(Holds(0, shared.get(), 32, kBytes));
}

// Landing parts within steps, every byte checked: rank 2 has only step-0
// requests (lists of four buckets each way with rank 0, cut into parts),
// rank 0 forwards what rank 2 sent to rank 1 in step 1. (That both sides of
// a pair cut alike, whatever steps the ranks have, is
// RoundGroupsTest's: this round is too small to stall on a cut that
// differs.)
TEST_P(TransportConformanceTest, LandingPartsWithinStepsMatchARankWithoutSteps) {
  if (factory().max_group_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  constexpr int kBuckets = 4;
  constexpr size_t kBytes = size_t{256} << 10;
  auto group = Group(3);
  ASSERT_EQ(group.size(), 3u);
  std::vector<std::shared_ptr<uint8_t>> to2, from0, from2, to1;
  for (int b = 0; b < kBuckets; ++b) {
    to2.push_back(Filled(0, 600 + b, kBytes));
    from0.push_back(factory().Allocate(2, kBytes));
    from2.push_back(Filled(2, 700 + b, kBytes));
    to1.push_back(factory().Allocate(1, kBytes));
  }
  std::vector<std::shared_ptr<uint8_t>> at0;
  for (int b = 0; b < kBuckets; ++b) at0.push_back(factory().Allocate(0, kBytes));
  RoundHooks hooks;
  hooks.max_landing_parts = 4;
  hooks.min_landing_part_bytes = 64 << 10;
  auto st = OnRanks(3, [&](int r) {
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    for (int b = 0; b < kBuckets; ++b) {
      if (r == 0) {
        sends.push_back({2, b, to2[b].get(), kBytes, 0});
        recvs.push_back({2, 10 + b, at0[b].get(), kBytes, 0});
        sends.push_back({1, 20 + b, at0[b].get(), kBytes, 1});
      }
      if (r == 1) recvs.push_back({0, 20 + b, to1[b].get(), kBytes, 1});
      if (r == 2) {
        recvs.push_back({0, b, from0[b].get(), kBytes, 0});
        sends.push_back({0, 10 + b, from2[b].get(), kBytes, 0});
      }
    }
    return group[r]->RunRound(sends, recvs, In(absl::Seconds(60)), hooks);
  });
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  for (int b = 0; b < kBuckets; ++b) {
    EXPECT_TRUE(Holds(2, from0[b].get(), 600 + b, kBytes)) << "bucket " << b << " on rank 2";
    EXPECT_TRUE(Holds(1, to1[b].get(), 700 + b, kBytes)) << "bucket " << b << " on rank 1";
  }
}

// Steps outside [0, kMaxBucketSteps) are refused before any communication.
TEST_P(TransportConformanceTest, RejectsStepsOutOfRange) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  auto buf = factory().Allocate(0, 8);
  const absl::Time deadline = In(absl::Seconds(10));
  for (int32_t step : {-1, 64}) {
    SendRequest s{1, 1, buf.get(), 8, step};
    const absl::Status sent = group[0]->RunRound({&s, 1}, {}, deadline);
    EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
    EXPECT_NE(sent.message().find("step"), std::string::npos) << sent;
    RecvRequest q{1, 1, buf.get(), 8, step};
    EXPECT_EQ(group[0]->RunRound({}, {&q, 1}, deadline).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace wsync::transport::conformance

#endif  // WSYNC_TESTS_WORKER_PLANE_TRANSPORT_STEPS_CONFORMANCE_H_
