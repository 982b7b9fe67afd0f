// Conformance suite every PeerWriter must pass (the contract in
// worker/plane/peer_writer.h). A backend's test binary includes this header
// in exactly one .cc, implements PeerWriterTestFactory and instantiates the
// suite:
//
//   using wsync::plane::conformance::PeerWriterConformanceTest;
//   INSTANTIATE_TEST_SUITE_P(Host, PeerWriterConformanceTest,
//                            ::testing::Values(std::make_shared<HostFactory>()),
//                            PeerWriterConformanceTest::ParamName);
//
// Covered: puts cast bit for bit as common/cast.h (strided on both sides)
// and are visible after Fence; a bad item fails the call, names the item and
// writes nothing; prepared lists replay on the current bytes, alone or not;
// empty calls; tokens round-trip through slots the transport can move;
// mailboxes (where the writer has them): a fresh one reads zero, its
// descriptor has the fixed size, slots outside it and posts to peers not
// opened are errors, bad descriptors are errors naming the peer (never a
// crash), and, where the factory can open a mailbox of this process
// (MailboxLoopback: not CUDA IPC), posts land in the peer's slots in order
// after fenced puts; put marks are reached once their puts landed, in
// order, and unknown marks are errors; put gates (where the factory can
// open a mailbox of this process): puts after a gate wait for the peer's
// signal, a signal lands after the puts before it, a silent peer's gate
// opens by its timeout (counted), and bad gate arguments are errors.
#ifndef WSYNC_TESTS_WORKER_PLANE_PEER_WRITER_CONFORMANCE_H_
#define WSYNC_TESTS_WORKER_PLANE_PEER_WRITER_CONFORMANCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/worker/plane/plane_test_memory.h"
#include "worker/plane/data_ops.h"
#include "worker/plane/peer_writer.h"

namespace wsync::plane::conformance {

struct WriterUnderTest {
  std::unique_ptr<exec::DataOps> ops;  // outlives the writer
  std::unique_ptr<exec::PeerWriter> writer;
};

class PeerWriterTestFactory : public TestMemory {
 public:
  virtual std::string Name() const = 0;
  // A writer and the data ops it puts beside.
  virtual absl::StatusOr<WriterUnderTest> Create() = 0;
  // A peer's buffer of `bytes`, mapped into this process the way the backend
  // maps peers (Read / Write reach it too).
  virtual std::shared_ptr<uint8_t> AllocatePeer(size_t bytes) = 0;
  // Whether one writer of this process can open another's mailbox (both
  // backends can: the CUDA one uses a peer of its own process's pointer).
  virtual bool MailboxLoopback() const { return false; }
};

class PeerWriterConformanceTest
    : public ::testing::TestWithParam<std::shared_ptr<PeerWriterTestFactory>> {
 public:
  static std::string ParamName(
      const ::testing::TestParamInfo<std::shared_ptr<PeerWriterTestFactory>>& info) {
    return info.param->Name();
  }

 protected:
  void SetUp() override {
    if (const std::string why = factory().Unavailable(); !why.empty()) GTEST_SKIP() << why;
    auto w = factory().Create();
    ASSERT_TRUE(w.ok()) << w.status();
    w_ = std::move(*w);
  }
  void TearDown() override {
    w_.writer.reset();
    w_.ops.reset();
  }
  PeerWriterTestFactory& factory() { return *GetParam(); }
  exec::PeerWriter& writer() { return *w_.writer; }
  exec::DataOps& ops() { return *w_.ops; }

  // Backend memory holding `host`'s bytes: a peer's buffer where `peer`.
  std::shared_ptr<uint8_t> Upload(const std::vector<uint8_t>& host, bool peer = false) {
    return peer ? factory().Filled(factory().AllocatePeer(host.size()), host)
                : factory().Upload(host);
  }
  std::vector<uint8_t> Download(const void* p, size_t bytes) {
    return factory().Download(p, bytes);
  }
  // Checks that (rows, cols) of `to` at `dst` (transposed) equal `src_host`
  // (from, padded rows) cast by common/cast.h.
  void ExpectCast(const std::vector<uint8_t>& src_host, DType from, int64_t pitch, const void* dst,
                  DType to, int64_t rows, int64_t cols) {
    const int64_t fs = DTypeSize(from), ts = DTypeSize(to);
    const std::vector<uint8_t> got = Download(dst, rows * cols * ts);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        uint8_t want[8] = {};
        ASSERT_TRUE(ConvertElements(At(src_host, fs, r, c, pitch, 1), from, want, to, 1).ok());
        ASSERT_EQ(std::memcmp(At(got, ts, r, c, 1, rows), want, ts), 0)
            << DTypeName(from) << " -> " << DTypeName(to) << " element (" << r << ", " << c << ")";
      }
    }
  }

  // n seeded fp32 values, a peer buffer of as many bytes filled with 0xEE,
  // and the item putting the one into the other.
  struct OnePut {
    std::vector<uint8_t> src_host;
    std::shared_ptr<uint8_t> src, dst;
    exec::CopyItem item;
  };
  OnePut MakeOnePut(int64_t n, uint32_t seed) {
    OnePut p;
    p.src_host = CastFrom(TestFloats(n, seed), v1::FP32);
    p.src = Upload(p.src_host);
    p.dst = Upload(std::vector<uint8_t>(n * 4, 0xEE), /*peer=*/true);
    p.item = {View2D(p.src.get(), v1::FP32, 1, n, n, 1), View2D(p.dst.get(), v1::FP32, 1, n, n, 1)};
    return p;
  }

  WriterUnderTest w_;
};

// One call with several items and casts, strided sources into transposed
// peer destinations; Fence makes every byte visible.
TEST_P(PeerWriterConformanceTest, PutsCastBitForBitAndFenceMakesThemVisible) {
  constexpr int64_t kRows = 6, kCols = 9, kPitch = 11;
  const std::vector<std::pair<DType, DType>> casts = {
      {v1::FP32, v1::FP32}, {v1::FP32, v1::BF16}, {v1::BF16, v1::BF16}, {v1::BF16, v1::FP32}};
  std::vector<std::vector<uint8_t>> src_host;
  std::vector<std::shared_ptr<uint8_t>> src, dst;
  std::vector<exec::CopyItem> items;
  for (size_t k = 0; k < casts.size(); ++k) {
    const auto [from, to] = casts[k];
    src_host.push_back(CastFrom(TestFloats(kRows * kPitch, 60 + k), from));
    src.push_back(Upload(src_host.back()));
    dst.push_back(Upload(std::vector<uint8_t>(kRows * kCols * DTypeSize(to), 0xEE), true));
    items.push_back({View2D(src.back().get(), from, kRows, kCols, kPitch, 1),
                     View2D(dst.back().get(), to, kRows, kCols, 1, kRows)});
  }
  ASSERT_TRUE(writer().Put(items, {}, /*alone=*/false).ok());
  ASSERT_TRUE(writer().Fence().ok());
  for (size_t k = 0; k < casts.size(); ++k) {
    ExpectCast(src_host[k], casts[k].first, kPitch, dst[k].get(), casts[k].second, kRows, kCols);
  }
}

// Every item is checked before any is issued: a bad one fails the call,
// named as "put item <i>" (and by ErrorItemIndex), and nothing is written.
TEST_P(PeerWriterConformanceTest, ABadItemFailsTheCallNamingItAndWritesNothing) {
  constexpr int64_t kN = 256;
  const std::vector<uint8_t> sentinel(kN * 4, 0xEE);
  auto src = Upload(CastFrom(TestFloats(kN, 9), v1::FP32));
  auto dst = Upload(sentinel, true);
  const exec::CopyItem good{View2D(src.get(), v1::FP32, 1, kN, kN, 1),
                            View2D(dst.get(), v1::FP32, 1, kN, kN, 1)};
  exec::CopyItem mismatched = good;
  mismatched.dst.shape[1] = kN / 2;
  exec::CopyItem null_dst = good;
  null_dst.dst.data = nullptr;
  for (bool alone : {false, true}) {
    absl::Status s = writer().Put({good, mismatched}, {}, alone);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(exec::ErrorItemIndex(s), 1) << s;
    EXPECT_NE(s.message().find("put item 1"), std::string::npos) << s;
    s = writer().Put({good, good, null_dst}, {}, alone);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(exec::ErrorItemIndex(s), 2) << s;
  }
  EXPECT_TRUE(writer().Fence().ok());
  EXPECT_EQ(Download(dst.get(), sentinel.size()), sentinel);
}

// A prepared list gets a handle of its own; puts given it (alone or beside
// other work) write the source bytes as they are at that call.
TEST_P(PeerWriterConformanceTest, PreparedPutsReplayOnTheCurrentBytes) {
  constexpr int64_t kRows = 8, kCols = 33, kPitch = 40;
  auto src = Upload(CastFrom(TestFloats(kRows * kPitch, 1), v1::FP32));
  auto dst = Upload(std::vector<uint8_t>(kRows * kCols * 2, 0xEE), true);
  const std::vector<exec::CopyItem> items = {{View2D(src.get(), v1::FP32, kRows, kCols, kPitch, 1),
                                              View2D(dst.get(), v1::BF16, kRows, kCols, 1, kRows)}};
  const exec::ItemsHandle h = writer().Prepare(items);
  const exec::ItemsHandle h2 = writer().Prepare(items);
  EXPECT_NE(h.id, 0u);
  EXPECT_NE(h.id, h2.id);
  uint32_t seed = 100;
  for (bool alone : {false, true, false}) {
    const std::vector<uint8_t> fresh = CastFrom(TestFloats(kRows * kPitch, ++seed), v1::FP32);
    factory().Write(src.get(), fresh.data(), fresh.size());
    ASSERT_TRUE(writer().Put(items, h, alone).ok());
    ASSERT_TRUE(writer().Fence().ok());
    SCOPED_TRACE(absl::StrCat("seed ", seed, alone ? ", alone" : ""));
    ExpectCast(fresh, v1::FP32, kPitch, dst.get(), v1::BF16, kRows, kCols);
  }
}

TEST_P(PeerWriterConformanceTest, EmptyPutsAndAFenceWithNothingIssuedAreOk) {
  EXPECT_TRUE(writer().Fence().ok());
  EXPECT_TRUE(writer().Put({}, {}, false).ok());
  EXPECT_TRUE(writer().Put({}, writer().Prepare({}), true).ok());
  EXPECT_TRUE(writer().Fence().ok());
}

// Puts run beside the data ops' calls: a copy queued on the ops and a put
// issued after it both land, whichever finishes first.
TEST_P(PeerWriterConformanceTest, PutsRunBesideTheDataOps) {
  constexpr int64_t kN = 1 << 15;
  const std::vector<uint8_t> a_host = CastFrom(TestFloats(kN, 77), v1::FP32);
  const std::vector<uint8_t> zeros(kN * 4, 0);
  auto a = Upload(a_host);
  auto b = Upload(zeros);
  auto peer = Upload(zeros, true);
  const exec::CopyItem local{View2D(a.get(), v1::FP32, 1, kN, kN, 1),
                             View2D(b.get(), v1::FP32, 1, kN, kN, 1)};
  const exec::CopyItem put{View2D(a.get(), v1::FP32, 1, kN, kN, 1),
                           View2D(peer.get(), v1::FP32, 1, kN, kN, 1)};
  ASSERT_TRUE(ops().Copy({local}).ok());
  ASSERT_TRUE(writer().Put({put}, {}, /*alone=*/false).ok());
  ASSERT_TRUE(writer().Fence().ok());
  ASSERT_TRUE(ops().Synchronize().ok());
  EXPECT_EQ(Download(peer.get(), zeros.size()), a_host);
  EXPECT_EQ(Download(b.get(), zeros.size()), a_host);
}

// Token slots hold what was written, as the 8 little-endian bytes the
// transport moves; asking for more slots keeps working.
TEST_P(PeerWriterConformanceTest, TokensRoundTripThroughTheirSlots) {
  const std::vector<uint64_t> values = {0, ~uint64_t{0}, 0x0123456789abcdefull, 42, 7};
  for (size_t count : {size_t{3}, size_t{5}, size_t{1}}) {
    auto slots = writer().TokenSlots(count);
    ASSERT_TRUE(slots.ok()) << slots.status();
    ASSERT_NE(*slots, nullptr);
    for (size_t k = 0; k < count; ++k) {
      ASSERT_TRUE(writer().WriteToken(*slots + k * exec::PeerWriter::kTokenBytes, values[k]).ok());
    }
    for (size_t k = 0; k < count; ++k) {
      const uint8_t* slot = *slots + k * exec::PeerWriter::kTokenBytes;
      auto got = writer().ReadToken(slot);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, values[k]) << "slot " << k << " of " << count;
      uint64_t raw = 0;
      factory().Read(&raw, slot, sizeof(raw));
      EXPECT_EQ(raw, values[k]) << "slot " << k << " of " << count;
    }
  }
}

// A fresh mailbox reads zero everywhere, its descriptor has the fixed size,
// and slots outside it or posts to a peer never opened are errors.
TEST_P(PeerWriterConformanceTest, AFreshMailboxReadsZeroAndRefusesSlotsOutsideIt) {
  if (!writer().HasMailbox()) GTEST_SKIP() << writer().Name() << " has no mailbox";
  for (int64_t slots : {int64_t{6}, int64_t{12}}) {
    auto d = writer().CreateMailbox(slots);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->size(), exec::PeerWriter::kMailboxDescriptorBytes);
    for (int64_t k = 0; k < slots; ++k) {
      auto v = writer().ReadMailbox(k);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(*v, 0u) << "slot " << k;
    }
    EXPECT_FALSE(writer().ReadMailbox(slots).ok());
    EXPECT_FALSE(writer().ReadMailbox(-1).ok());
  }
  EXPECT_FALSE(writer().CreateMailbox(0).ok());
  EXPECT_FALSE(writer().CreateMailbox(exec::PeerWriter::kMaxMailboxSlots + 1).ok());
  const absl::Status s = writer().Post(3, 0, 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("worker 3"), std::string::npos) << s;
}

// Descriptors a peer may send wrong: each is an error naming the peer.
TEST_P(PeerWriterConformanceTest, ABadMailboxDescriptorIsAnErrorNamingThePeer) {
  if (!writer().HasMailbox()) GTEST_SKIP() << writer().Name() << " has no mailbox";
  auto good = writer().CreateMailbox(6);
  ASSERT_TRUE(good.ok()) << good.status();
  std::vector<std::string> bad = {"", std::string(5, 'x'),
                                  std::string(exec::PeerWriter::kMailboxDescriptorBytes, '\0'),
                                  *good + "x"};
  std::string magic = *good;
  magic[0] ^= 1;
  bad.push_back(magic);
  std::string slots = *good;  // declares 2^56 slots
  slots[15] = 1;
  bad.push_back(slots);
  std::string more = *good;  // declares 65536 more slots than its memory holds
  more[10] = 1;
  bad.push_back(more);
  std::string tail = *good;  // no NUL anywhere after the header
  for (size_t i = 16; i < tail.size(); ++i) tail[i] = 'A';
  bad.push_back(tail);
  for (size_t i = 0; i < bad.size(); ++i) {
    const absl::Status s = writer().OpenPeerMailbox(5, bad[i]);
    EXPECT_FALSE(s.ok()) << "descriptor " << i;
    EXPECT_NE(s.message().find("worker 5"), std::string::npos) << "descriptor " << i << ": " << s;
    EXPECT_FALSE(writer().Post(5, 0, 1).ok()) << "descriptor " << i << " left a mapping";
  }
}

// Two writers of one process as two peers: posts land in the peer's slot,
// later posts win, and a post after fenced puts comes after their bytes.
TEST_P(PeerWriterConformanceTest, PostsLandInThePeersSlotsAfterFencedPuts) {
  if (!writer().HasMailbox()) GTEST_SKIP() << writer().Name() << " has no mailbox";
  if (!factory().MailboxLoopback()) GTEST_SKIP() << "the factory opens no mailbox of its process";
  auto other = factory().Create();
  ASSERT_TRUE(other.ok()) << other.status();
  exec::PeerWriter& peer = *other->writer;
  auto mine = writer().CreateMailbox(9);
  auto theirs = peer.CreateMailbox(9);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  ASSERT_TRUE(writer().OpenPeerMailbox(1, *theirs).ok());
  ASSERT_TRUE(peer.OpenPeerMailbox(0, *mine).ok());
  constexpr int64_t kRows = 32, kCols = 32;
  const std::vector<uint8_t> bytes = CastFrom(TestFloats(kRows * kCols, 77), v1::FP32);
  auto src = Upload(bytes);
  auto dst = Upload(std::vector<uint8_t>(bytes.size(), 0), /*peer=*/true);
  const std::vector<exec::CopyItem> items = {{View2D(src.get(), v1::FP32, kRows, kCols, kCols, 1),
                                              View2D(dst.get(), v1::FP32, kRows, kCols, kCols, 1)}};
  ASSERT_TRUE(writer().Put(items, {}, /*alone=*/false).ok());
  ASSERT_TRUE(writer().Fence().ok());
  ASSERT_TRUE(writer().Post(1, 2, 7).ok());
  ASSERT_TRUE(writer().Post(1, 2, 8).ok());
  ASSERT_TRUE(writer().Post(1, 8, ~uint64_t{0}).ok());
  EXPECT_FALSE(writer().Post(1, 9, 1).ok()) << "slot 9 of 9";
  auto v = peer.ReadMailbox(2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 8u);
  EXPECT_EQ(Download(dst.get(), bytes.size()), bytes) << "the post came before the put's bytes";
  EXPECT_EQ(*peer.ReadMailbox(8), ~uint64_t{0});
  EXPECT_EQ(*peer.ReadMailbox(0), 0u);
  EXPECT_EQ(*writer().ReadMailbox(2), 0u) << "posts go to the peer's mailbox, not one's own";
  ASSERT_TRUE(peer.Post(0, 4, 3).ok());
  EXPECT_EQ(*writer().ReadMailbox(4), 3u);
}

// A mark names the puts issued before it: once PollMark says so, their bytes
// are visible without a Fence; marks are reached in order; one never made is
// an error.
TEST_P(PeerWriterConformanceTest, PutMarksAreReachedOnceTheirPutsLanded) {
  constexpr int64_t kN = 1 << 16;
  const std::vector<uint8_t> src_host = CastFrom(TestFloats(kN, 91), v1::FP32);
  auto src = Upload(src_host);
  std::vector<std::shared_ptr<uint8_t>> dst;
  std::vector<uint64_t> marks;
  for (int k = 0; k < 3; ++k) {
    dst.push_back(Upload(std::vector<uint8_t>(kN * 4, 0xEE), true));
    const exec::CopyItem item{View2D(src.get(), v1::FP32, 1, kN, kN, 1),
                              View2D(dst.back().get(), v1::FP32, 1, kN, kN, 1)};
    ASSERT_TRUE(writer().Put({item}, {}, false).ok());
    auto m = writer().Mark();
    ASSERT_TRUE(m.ok()) << m.status();
    if (!marks.empty()) {
      EXPECT_GT(*m, marks.back());
    }
    marks.push_back(*m);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int k = 2; k >= 0; --k) {  // the last first: every earlier one is then reached too
    for (;;) {
      auto reached = writer().PollMark(marks[k]);
      ASSERT_TRUE(reached.ok()) << reached.status();
      if (*reached) break;
      ASSERT_LT(absl::Now(), deadline) << "mark " << k << " never reached";
    }
    EXPECT_EQ(Download(dst[k].get(), kN * 4), src_host) << "put " << k;
  }
  EXPECT_FALSE(writer().PollMark(marks.back() + 1000).ok());
  EXPECT_FALSE(writer().PollMark(0).ok());
  EXPECT_TRUE(writer().Fence().ok());
}

// Two writers of this process whose mailboxes (8 slots) are open to each
// other: the writer under test is worker 0, `peer` worker 1.
#define WSYNC_GATE_PAIR_OR_SKIP(peer)                                                              \
  if (!writer().HasPutGates()) GTEST_SKIP() << writer().Name() << " has no put gates";             \
  if (!factory().MailboxLoopback()) GTEST_SKIP() << "the factory opens no mailbox of its process"; \
  auto other = factory().Create();                                                                 \
  ASSERT_TRUE(other.ok()) << other.status();                                                       \
  exec::PeerWriter& peer = *other->writer;                                                         \
  {                                                                                                \
    auto mine = writer().CreateMailbox(8);                                                         \
    auto theirs = peer.CreateMailbox(8);                                                           \
    ASSERT_TRUE(mine.ok() && theirs.ok());                                                         \
    ASSERT_TRUE(writer().OpenPeerMailbox(1, *theirs).ok());                                        \
    ASSERT_TRUE(peer.OpenPeerMailbox(0, *mine).ok());                                              \
  }

// Puts issued after a gate land only once the peer signalled; the gate did
// not time out.
TEST_P(PeerWriterConformanceTest, PutsAfterAGateWaitForThePeersSignal) {
  WSYNC_GATE_PAIR_OR_SKIP(peer);
  constexpr int64_t kN = 1 << 14;
  const OnePut one = MakeOnePut(kN, 5);
  const exec::CopyItem& item = one.item;
  const std::vector<uint8_t>& src_host = one.src_host;
  const void* dst = one.dst.get();
  auto before = writer().GatesTimedOut();
  ASSERT_TRUE(before.ok()) << before.status();
  std::atomic<bool> signalled{false};
  std::thread signaller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    signalled = true;
    EXPECT_TRUE(peer.SignalAfterPuts({{0, 3, 42}}).ok());
  });
  const std::vector<exec::PeerWriter::GateWait> waits = {{3, 42}};
  ASSERT_TRUE(writer().GatePuts(waits, absl::Seconds(30)).ok());
  ASSERT_TRUE(writer().Put({item}, {}, false).ok());
  if (!signalled) {  // a device gates on its stream: the put is queued behind it
    absl::SleepFor(absl::Milliseconds(100));
    const bool early = signalled;
    const std::vector<uint8_t> got = Download(dst, kN * 4);
    if (!early) {
      EXPECT_EQ(got, std::vector<uint8_t>(kN * 4, 0xEE)) << "the put passed its gate";
    }
  }
  ASSERT_TRUE(writer().Fence().ok());
  signaller.join();
  EXPECT_EQ(Download(dst, kN * 4), src_host);
  EXPECT_EQ(*writer().GatesTimedOut(), *before) << "the gate opened by the signal";
}

// A signal lands only after the puts issued before it: a peer that reads it
// reads their bytes.
TEST_P(PeerWriterConformanceTest, ASignalLandsAfterThePutsBeforeIt) {
  WSYNC_GATE_PAIR_OR_SKIP(peer);
  constexpr int64_t kN = 1 << 20;
  const OnePut one = MakeOnePut(kN, 6);
  const exec::CopyItem& item = one.item;
  const std::vector<uint8_t>& src_host = one.src_host;
  const void* dst = one.dst.get();
  ASSERT_TRUE(writer().Put({item}, {}, false).ok());
  ASSERT_TRUE(writer().SignalAfterPuts({{1, 2, 9}}).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    auto v = peer.ReadMailbox(2);
    ASSERT_TRUE(v.ok()) << v.status();
    if (*v == 9) break;
    ASSERT_EQ(*v, 0u);
    ASSERT_LT(absl::Now(), deadline) << "the signal never landed";
  }
  EXPECT_EQ(Download(dst, kN * 4), src_host) << "the signal came before the put's bytes";
  EXPECT_TRUE(writer().Fence().ok());
}

// A gate whose peer stays silent opens by its timeout, counted; later puts
// then run as usual.
TEST_P(PeerWriterConformanceTest, ASilentPeersGateOpensByItsTimeout) {
  WSYNC_GATE_PAIR_OR_SKIP(peer);
  constexpr int64_t kN = 4096;
  const OnePut one = MakeOnePut(kN, 7);
  const exec::CopyItem& item = one.item;
  const std::vector<uint8_t>& src_host = one.src_host;
  const void* dst = one.dst.get();
  auto before = writer().GatesTimedOut();
  ASSERT_TRUE(before.ok()) << before.status();
  const absl::Time start = absl::Now();
  const std::vector<exec::PeerWriter::GateWait> waits = {{5, 1}, {6, 0}};
  ASSERT_TRUE(writer().GatePuts(waits, absl::Milliseconds(200)).ok());
  ASSERT_TRUE(writer().Put({item}, {}, false).ok());
  ASSERT_TRUE(writer().Fence().ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_EQ(Download(dst, kN * 4), src_host);
  EXPECT_EQ(*writer().GatesTimedOut(), *before + 1);
}

// Bad gate arguments are errors.
TEST_P(PeerWriterConformanceTest, BadGateArgumentsAreErrors) {
  WSYNC_GATE_PAIR_OR_SKIP(peer);
  const std::vector<exec::PeerWriter::GateWait> outside = {{8, 1}};
  EXPECT_FALSE(writer().GatePuts(outside, absl::Seconds(1)).ok()) << "slot 8 of 8";
  const std::vector<exec::PeerWriter::GateWait> fine = {{1, 0}};
  EXPECT_FALSE(writer().GatePuts(fine, absl::ZeroDuration()).ok()) << "a zero timeout";
  EXPECT_FALSE(writer().GatePuts(fine, -absl::Seconds(1)).ok()) << "a negative timeout";
  // The bad post first: no writer posts the good one after it.
  EXPECT_FALSE(writer().SignalAfterPuts({{1, 8, 5}, {1, 1, 5}}).ok()) << "slot 8 of 8";
  EXPECT_FALSE(writer().SignalAfterPuts({{7, 1, 5}, {1, 2, 5}}).ok()) << "worker 7 not opened";
  EXPECT_TRUE(writer().Fence().ok());
  EXPECT_EQ(*peer.ReadMailbox(1), 0u) << "a refused signal posted";
  EXPECT_EQ(*peer.ReadMailbox(2), 0u) << "a refused signal posted";
}

#undef WSYNC_GATE_PAIR_OR_SKIP

}  // namespace wsync::plane::conformance

#endif  // WSYNC_TESTS_WORKER_PLANE_PEER_WRITER_CONFORMANCE_H_
