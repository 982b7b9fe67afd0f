// Conformance suite every Transport backend must pass. A backend's test
// binary includes this header in exactly one .cc, implements
// TransportTestFactory and instantiates the suite:
//
//   using wsync::transport::conformance::TransportConformanceTest;
//   INSTANTIATE_TEST_SUITE_P(Gloo, TransportConformanceTest,
//                            ::testing::Values(std::make_shared<GlooFactory>()),
//                            TransportConformanceTest::ParamName);
//
// Error-message contract checked here: a deadline or abort error names every
// pending peer as "peer <rank>".
#ifndef WSYNC_TESTS_WORKER_PLANE_TRANSPORT_CONFORMANCE_H_
#define WSYNC_TESTS_WORKER_PLANE_TRANSPORT_CONFORMANCE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/plane/transport.h"

namespace wsync::transport::conformance {

class TransportTestFactory {
 public:
  virtual ~TransportTestFactory() = default;
  virtual std::string Name() const = 0;
  // Largest group CreateGroup supports (e.g. the number of GPUs).
  virtual int max_group_size() const = 0;
  // One connected group: element r is rank r. May connect ranks concurrently.
  virtual absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGroup(int size) = 0;

  // Memory the transport of `rank` can move (host or device), and copies
  // between it and host memory. Defaults: host memory.
  virtual std::shared_ptr<uint8_t> Allocate(int rank, size_t bytes) {
    return std::shared_ptr<uint8_t>(new uint8_t[bytes == 0 ? 1 : bytes],
                                    std::default_delete<uint8_t[]>());
  }
  virtual void Write(int rank, void* dst, const void* host, size_t bytes) {
    std::memcpy(dst, host, bytes);
  }
  virtual void Read(int rank, void* host, const void* src, size_t bytes) {
    std::memcpy(host, src, bytes);
  }
  // Reads `src` once `mark` (from RoundHooks::on_landed, during the callback)
  // is reached. Default: host memory, where the mark is null.
  virtual void ReadLanded(int rank, const LandingMark& mark, void* host, const void* src,
                          size_t bytes) {
    EXPECT_EQ(mark.handle, nullptr) << "a host transport's landing mark";
    Read(rank, host, src, bytes);
  }
};

class TransportConformanceTest
    : public ::testing::TestWithParam<std::shared_ptr<TransportTestFactory>> {
 public:
  static std::string ParamName(
      const ::testing::TestParamInfo<std::shared_ptr<TransportTestFactory>>& info) {
    return info.param->Name();
  }

 protected:
  TransportTestFactory& factory() { return *GetParam(); }

  std::vector<std::unique_ptr<Transport>> Group(int size) {
    auto group = factory().CreateGroup(size);
    EXPECT_TRUE(group.ok()) << group.status();
    if (!group.ok()) return {};
    EXPECT_EQ(group->size(), static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ((*group)[r]->rank(), r);
      EXPECT_EQ((*group)[r]->size(), size);
    }
    return std::move(*group);
  }

  // Runs fn(rank) on one thread per rank; returns each rank's status.
  static std::vector<absl::Status> OnRanks(int size, const std::function<absl::Status(int)>& fn) {
    std::vector<absl::Status> out(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
    for (auto& t : threads) t.join();
    return out;
  }

  static std::vector<uint8_t> Pattern(uint64_t seed, size_t bytes) {
    std::vector<uint8_t> v(bytes);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < bytes; i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::memcpy(v.data() + i, &x, std::min<size_t>(8, bytes - i));
    }
    return v;
  }

  // A device-side buffer holding Pattern(seed, bytes).
  std::shared_ptr<uint8_t> Filled(int rank, uint64_t seed, size_t bytes) {
    auto buf = factory().Allocate(rank, bytes);
    const std::vector<uint8_t> host = Pattern(seed, bytes);
    factory().Write(rank, buf.get(), host.data(), bytes);
    return buf;
  }
  bool Holds(int rank, const uint8_t* buf, uint64_t seed, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    factory().Read(rank, host.data(), buf, bytes);
    return host == Pattern(seed, bytes);
  }

  static absl::Time In(absl::Duration d) { return absl::Now() + d; }
};

// Two ranks exchange one message of each size, both directions at once.
TEST_P(TransportConformanceTest, PairwiseSizes) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1} << 20, size_t{64} << 20}) {
    std::vector<std::shared_ptr<uint8_t>> send(2), recv(2);
    for (int r = 0; r < 2; ++r) {
      send[r] = Filled(r, 100 + r + bytes, bytes);
      recv[r] = factory().Allocate(r, bytes);
    }
    auto st = OnRanks(2, [&](int r) {
      const int peer = 1 - r;
      SendRequest s{peer, 7, send[r].get(), bytes};
      RecvRequest q{peer, 7, recv[r].get(), bytes};
      return group[r]->RunRound({&s, 1}, {&q, 1}, In(absl::Seconds(60)));
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(st[r].ok()) << "rank " << r << " bytes " << bytes << ": " << st[r];
      EXPECT_TRUE(Holds(r, recv[r].get(), 100 + (1 - r) + bytes, bytes))
          << "rank " << r << " " << bytes;
    }
  }
}

// Zero-byte requests need no memory and no matching work from the peer.
TEST_P(TransportConformanceTest, ZeroBytesCompleteWithoutPeer) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  SendRequest s{1, 3, nullptr, 0};
  RecvRequest q{1, 4, nullptr, 0};
  const absl::Time start = absl::Now();
  EXPECT_TRUE(group[0]->RunRound({&s, 1}, {&q, 1}, In(absl::Seconds(30))).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Many buckets between one pair in one round, matched by tag, with sizes that
// differ per bucket so a mismatch cannot go unnoticed.
TEST_P(TransportConformanceTest, ManyBucketsOnePairMatchedByTag) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  constexpr int kBuckets = 40;
  std::vector<std::shared_ptr<uint8_t>> src, dst;
  std::vector<size_t> sizes;
  for (int b = 0; b < kBuckets; ++b) {
    sizes.push_back(1 + 997 * b);
    src.push_back(Filled(0, 1000 + b, sizes[b]));
    dst.push_back(factory().Allocate(1, sizes[b]));
  }
  auto st = OnRanks(2, [&](int r) {
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    for (int b = 0; b < kBuckets; ++b) {
      const int64_t tag = 5 + 3 * b;  // sparse tags, increasing
      if (r == 0) sends.push_back({1, tag, src[b].get(), sizes[b]});
      if (r == 1) recvs.push_back({0, tag, dst[b].get(), sizes[b]});
    }
    return group[r]->RunRound(sends, recvs, In(absl::Seconds(60)));
  });
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  for (int b = 0; b < kBuckets; ++b) {
    EXPECT_TRUE(Holds(1, dst[b].get(), 1000 + b, sizes[b])) << "bucket " << b;
  }
}

// Every rank sends a distinct buffer to every other rank in one round.
TEST_P(TransportConformanceTest, AllToAllFourRanks) {
  if (factory().max_group_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  constexpr int kRanks = 4;
  auto group = Group(kRanks);
  ASSERT_EQ(group.size(), static_cast<size_t>(kRanks));
  auto bytes_of = [](int s, int d) { return size_t{4096} * (1 + s) + 17 * d; };
  std::vector<std::vector<std::shared_ptr<uint8_t>>> src(kRanks), dst(kRanks);
  for (int s = 0; s < kRanks; ++s) {
    for (int d = 0; d < kRanks; ++d) {
      src[s].push_back(Filled(s, s * 10 + d, bytes_of(s, d)));
      dst[d].push_back(factory().Allocate(d, bytes_of(s, d)));
    }
  }
  auto st = OnRanks(kRanks, [&](int r) {
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    for (int p = 0; p < kRanks; ++p) {
      if (p == r) continue;
      sends.push_back({p, r * kRanks + p, src[r][p].get(), bytes_of(r, p)});
      recvs.push_back({p, p * kRanks + r, dst[r][p].get(), bytes_of(p, r)});
    }
    return group[r]->RunRound(sends, recvs, In(absl::Seconds(60)));
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  for (int d = 0; d < kRanks; ++d) {
    for (int s = 0; s < kRanks; ++s) {
      if (s == d) continue;
      EXPECT_TRUE(Holds(d, dst[d][s].get(), s * 10 + d, bytes_of(s, d))) << s << "->" << d;
    }
  }
}

// Invalid requests are rejected before any communication.
TEST_P(TransportConformanceTest, RejectsSelfPeerRangeNullAndDuplicates) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  auto buf = factory().Allocate(0, 8);
  Transport& t = *group[0];
  const absl::Time deadline = In(absl::Seconds(10));
  SendRequest self{0, 1, buf.get(), 8};
  EXPECT_EQ(t.RunRound({&self, 1}, {}, deadline).code(), absl::StatusCode::kInvalidArgument);
  RecvRequest self_recv{0, 1, buf.get(), 8};
  EXPECT_EQ(t.RunRound({}, {&self_recv, 1}, deadline).code(), absl::StatusCode::kInvalidArgument);
  SendRequest out_of_range{2, 1, buf.get(), 8};
  EXPECT_EQ(t.RunRound({&out_of_range, 1}, {}, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  SendRequest null_data{1, 1, nullptr, 8};
  EXPECT_EQ(t.RunRound({&null_data, 1}, {}, deadline).code(), absl::StatusCode::kInvalidArgument);
  SendRequest dup[2] = {{1, 9, buf.get(), 4}, {1, 9, buf.get() + 4, 4}};
  EXPECT_EQ(t.RunRound(dup, {}, deadline).code(), absl::StatusCode::kInvalidArgument);

  // Still usable after rejected requests.
  auto src = Filled(0, 77, 1000);
  auto dst = factory().Allocate(1, 1000);
  auto st = OnRanks(2, [&](int r) {
    SendRequest s{1, 2, src.get(), 1000};
    RecvRequest q{0, 2, dst.get(), 1000};
    return r == 0 ? group[0]->RunRound({&s, 1}, {}, In(absl::Seconds(30)))
                  : group[1]->RunRound({}, {&q, 1}, In(absl::Seconds(30)));
  });
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  EXPECT_TRUE(Holds(1, dst.get(), 77, 1000));
}

// on_posted runs once per round, after posting and before waiting: here rank
// 0 posts its send only after rank 1's on_posted ran, which deadlocks (until
// the deadline) a transport that would call it after completion.
TEST_P(TransportConformanceTest, OnPostedRunsOnceBeforeTheRoundWaits) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  auto src = Filled(0, 5, 4096);
  auto dst = factory().Allocate(1, 4096);
  SendRequest s{1, 1, src.get(), 4096};
  RecvRequest q{0, 1, dst.get(), 4096};
  // Warm-up: both sides post at once (connections are set up lazily).
  auto warm = OnRanks(2, [&](int r) {
    return r == 0 ? group[0]->RunRound({&s, 1}, {}, In(absl::Seconds(30)))
                  : group[1]->RunRound({}, {&q, 1}, In(absl::Seconds(30)));
  });
  ASSERT_TRUE(warm[0].ok()) << warm[0];
  ASSERT_TRUE(warm[1].ok()) << warm[1];

  std::atomic<int> calls{0};
  std::atomic<bool> receiver_posted{false};
  auto st = OnRanks(2, [&](int r) {
    if (r == 1) {
      return group[1]->RunRound({}, {&q, 1}, In(absl::Seconds(20)), [&] {
        ++calls;
        receiver_posted.store(true);
      });
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!receiver_posted.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    if (!receiver_posted.load()) return absl::DeadlineExceededError("on_posted never ran");
    return group[0]->RunRound({&s, 1}, {}, In(absl::Seconds(20)));
  });
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(Holds(1, dst.get(), 5, 4096));

  // Nothing to post: once, at once. Rejected requests: never.
  int empty_calls = 0;
  EXPECT_TRUE(group[0]->RunRound({}, {}, In(absl::Seconds(5)), [&] { ++empty_calls; }).ok());
  EXPECT_EQ(empty_calls, 1);
  int rejected_calls = 0;
  SendRequest self{0, 1, src.get(), 8};
  EXPECT_EQ(
      group[0]->RunRound({&self, 1}, {}, In(absl::Seconds(5)), [&] { ++rejected_calls; }).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rejected_calls, 0);
}

// A peer that never posts its side: DEADLINE_EXCEEDED naming it, on time.
TEST_P(TransportConformanceTest, SilentPeerGivesDeadlineExceededNamingPeer) {
  if (factory().max_group_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  auto group = Group(3);
  ASSERT_EQ(group.size(), 3u);
  auto src = Filled(0, 1, 4096);
  auto dst = factory().Allocate(0, 4096);
  auto dst2 = factory().Allocate(1, 4096);
  // Rank 2 never shows up. Rank 1 only talks to rank 0: it completes (Gloo)
  // or, where rank 0's group progresses as one (NCCL), fails at its own,
  // later deadline naming rank 0.
  auto st = OnRanks(2, [&](int r) {
    if (r == 1) {
      RecvRequest q{0, 11, dst2.get(), 4096};
      return group[1]->RunRound({}, {&q, 1}, In(absl::Seconds(4)));
    }
    SendRequest s[2] = {{1, 11, src.get(), 4096}, {2, 12, src.get(), 4096}};
    RecvRequest q{2, 13, dst.get(), 4096};
    const absl::Time start = absl::Now();
    absl::Status status = group[0]->RunRound(s, {&q, 1}, start + absl::Seconds(1));
    const absl::Duration took = absl::Now() - start;
    EXPECT_LT(took, absl::Seconds(4)) << "deadline not honoured";
    EXPECT_GE(took, absl::Milliseconds(900));
    return status;
  });
  if (!st[1].ok()) {
    EXPECT_EQ(st[1].code(), absl::StatusCode::kDeadlineExceeded) << st[1];
    EXPECT_NE(st[1].message().find("peer 0"), std::string::npos) << st[1];
  }
  EXPECT_EQ(st[0].code(), absl::StatusCode::kDeadlineExceeded) << st[0];
  EXPECT_NE(st[0].message().find("peer 2"), std::string::npos) << st[0];
  // The transport is unusable afterwards and says so without hanging.
  SendRequest s{1, 20, src.get(), 16};
  const absl::Time start = absl::Now();
  EXPECT_FALSE(group[0]->RunRound({&s, 1}, {}, In(absl::Seconds(5))).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

// Abort from another thread ends a round that would otherwise wait a minute.
TEST_P(TransportConformanceTest, AbortUnblocksPendingRound) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  auto dst = factory().Allocate(0, 1 << 20);
  absl::Status status;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {
    RecvRequest q{1, 1, dst.get(), 1 << 20};
    status = group[0]->RunRound({}, {&q, 1}, In(absl::Seconds(60)));
  });
  absl::SleepFor(absl::Milliseconds(300));
  group[0]->Abort("test abort");
  group[0]->Abort("second abort is harmless");
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_NE(status.message().find("peer 1"), std::string::npos) << status;
  RecvRequest q{1, 2, dst.get(), 16};
  EXPECT_FALSE(group[0]->RunRound({}, {&q, 1}, In(absl::Seconds(5))).ok());
}

// One transport carries many rounds; tags repeat across rounds (as bucket ids
// do across syncs) and sizes change.
TEST_P(TransportConformanceTest, ReusedForManyRounds) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  constexpr int kRounds = 60;
  for (int round = 0; round < kRounds; ++round) {
    const size_t bytes = 1 + (round * 7919) % 70000;
    auto a = Filled(0, round, bytes), b = Filled(1, 1000 + round, bytes);
    auto ra = factory().Allocate(0, bytes), rb = factory().Allocate(1, bytes);
    auto st = OnRanks(2, [&](int r) {
      SendRequest s{1 - r, round % 3, r == 0 ? a.get() : b.get(), bytes};
      RecvRequest q{1 - r, round % 3, r == 0 ? ra.get() : rb.get(), bytes};
      return group[r]->RunRound({&s, 1}, {&q, 1}, In(absl::Seconds(30)));
    });
    ASSERT_TRUE(st[0].ok()) << "round " << round << ": " << st[0];
    ASSERT_TRUE(st[1].ok()) << "round " << round << ": " << st[1];
    ASSERT_TRUE(Holds(0, ra.get(), 1000 + round, bytes)) << round;
    ASSERT_TRUE(Holds(1, rb.get(), round, bytes)) << round;
  }
}

// Landing parts (RoundHooks): each receive with bytes is named at most once,
// after on_posted, never in the last part, and holds its bytes once its mark
// is reached; both ranks
// send and receive, each list cut into several parts, so a transport that
// cut the two sides of a pair differently would stall or mismatch here.
TEST_P(TransportConformanceTest, LandingPartsNameEachReceiveOnceWithItsBytes) {
  auto group = Group(2);
  ASSERT_EQ(group.size(), 2u);
  const int kBuckets[2] = {40, 25};  // sent by rank 0, by rank 1
  auto size_of = [](int from, int b) { return size_t{1} + 4093 * b + 311 * from; };
  std::vector<std::shared_ptr<uint8_t>> src[2], dst[2];
  for (int from = 0; from < 2; ++from) {
    for (int b = 0; b < kBuckets[from]; ++b) {
      src[from].push_back(Filled(from, 7000 + 100 * from + b, size_of(from, b)));
      dst[from].push_back(factory().Allocate(1 - from, size_of(from, b)));
    }
  }
  std::vector<int> named[2];
  std::vector<int> bad[2];
  auto st = OnRanks(2, [&](int r) {
    const int peer = 1 - r;
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    recvs.push_back({peer, 999, nullptr, 0});  // 0 bytes: never named
    for (int b = 0; b < kBuckets[r]; ++b)
      sends.push_back({peer, b, src[r][b].get(), size_of(r, b)});
    for (int b = 0; b < kBuckets[peer]; ++b) {
      recvs.push_back({peer, b, dst[peer][b].get(), size_of(peer, b)});
    }
    bool posted = false;
    RoundHooks hooks;
    hooks.on_posted = [&] { posted = true; };
    hooks.max_landing_parts = 4;
    hooks.min_landing_part_bytes = 4096;
    hooks.on_landed = [&](absl::Span<const size_t> indices, const LandingMark& mark) {
      for (const size_t i : indices) {
        named[r].push_back(static_cast<int>(i));
        if (!posted || i == 0 || i >= recvs.size()) {
          bad[r].push_back(static_cast<int>(i));
          continue;
        }
        std::vector<uint8_t> host(recvs[i].bytes);
        factory().ReadLanded(r, mark, host.data(), recvs[i].data, recvs[i].bytes);
        const int b = static_cast<int>(i) - 1;
        if (host != Pattern(7000 + 100 * peer + b, recvs[i].bytes)) bad[r].push_back(b);
      }
    };
    return group[r]->RunRound(sends, recvs, In(absl::Seconds(60)), hooks);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    EXPECT_TRUE(bad[r].empty()) << "rank " << r << ": " << bad[r].size() << " receives named "
                                << "before posting, twice, out of range or without their bytes";
    // Both ranks receive in several parts: some receives land before the
    // last part (a transport that reports landing names them).
    EXPECT_FALSE(named[r].empty()) << "rank " << r << ": no receive named before the last part";
    std::vector<int> sorted = named[r];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "named twice";
    for (int b = 0; b < kBuckets[1 - r]; ++b) {
      EXPECT_TRUE(Holds(r, dst[1 - r][b].get(), 7000 + 100 * (1 - r) + b, size_of(1 - r, b)))
          << "rank " << r << " bucket " << b;
    }
  }
}

}  // namespace wsync::transport::conformance

#endif  // WSYNC_TESTS_WORKER_PLANE_TRANSPORT_CONFORMANCE_H_
