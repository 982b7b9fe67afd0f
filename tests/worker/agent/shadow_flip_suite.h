// Flip commits through ShadowSet (docs/commit-flip.md), for any backend with
// arenas: tests/worker/agent/shadow_flip_test.cc runs it over the host
// backend in CPU CI, tests/gpu/shadow_swap_cuda_test.cc over CUDA (the same
// ShadowSwapFactory as the swap suite):
//
//   INSTANTIATE_TEST_SUITE_P(Host, ShadowFlipTest, ::testing::Values(...),
//                            ShadowFlipTest::ParamName);
//
// The owner's weights lie in a flip pair: "inference/a" at 0 and
// "inference/b" at kB of the arena it serves from, and bytes no sync writes
// (before kB, after b). The test plays the sync runner's part after a
// commit (the live registry moved onto the partner, WeightArenas::Flipped)
// and the owner's (WeightArenas::Ack).
#ifndef WSYNC_TESTS_WORKER_AGENT_SHADOW_FLIP_SUITE_H_
#define WSYNC_TESTS_WORKER_AGENT_SHADOW_FLIP_SUITE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/agent/shadow_swap_suite.h"
#include "worker/agent/shadow_set.h"
#include "worker/agent/weight_arenas.h"

namespace wsync::agent {

class ShadowFlipTest : public ::testing::TestWithParam<std::shared_ptr<ShadowSwapFactory>> {
 public:
  static std::string ParamName(
      const ::testing::TestParamInfo<std::shared_ptr<ShadowSwapFactory>>& info) {
    return info.param->Name();
  }

 protected:
  static constexpr int64_t kA = 96 << 10;   // bytes of inference/a (written whole)
  static constexpr int64_t kB = 128 << 10;  // offset of inference/b
  static constexpr int64_t kBBytes = 64 << 10;

  void SetUp() override {
    if (const std::string why = f().Unavailable(); !why.empty()) GTEST_SKIP() << why;
    arenas_ = std::make_unique<WeightArenas>(&f().backend(), absl::Milliseconds(200));
    auto pair = arenas_->CreatePair(kB + kBBytes + 1000, "weights", "test worker");
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = {pair->first.arena, pair->second.arena};
    handles_ = {pair->first.handle, pair->second.handle};
    Set(*pair_[0], 0, pair_[0]->bytes(), 1);
    Set(*pair_[1], 0, pair_[1]->bytes(), 77);  // what the partner held before: never served
    Serve(0);
  }
  ShadowSwapFactory& f() { return *GetParam(); }
  static uint8_t* At(const plane::SwapArena& a, int64_t offset) {
    return static_cast<uint8_t*>(a.base()) + offset;
  }
  void Set(const plane::SwapArena& a, int64_t offset, int64_t bytes, uint8_t value) {
    std::vector<uint8_t> v(static_cast<size_t>(bytes), value);
    f().Write(At(a, offset), v.data(), v.size());
  }
  // The live registry over arena `i` of the pair (what a rebased tensor
  // table gives the next sync).
  void Serve(int i) {
    serving_ = i;
    const std::vector<std::tuple<std::string, int64_t, int64_t>> buffers = {
        {"inference/a", 0, kA}, {"inference/b", kB, kBBytes}};
    for (const auto& [name, offset, bytes] : buffers) {
      exec::RegisteredBuffer b{At(*pair_[i], offset), bytes, v1::UINT8, f().space()};
      (void)live_.Unregister(exec::BufferSide::kDestination, name);
      ASSERT_TRUE(live_.Register(exec::BufferSide::kDestination, name, b).ok());
    }
  }
  std::map<std::string, BufferWrites> Writes() const {
    return {{"inference/a", BufferWrites{kA, {ShadowRange(0, kA)}}},
            {"inference/b",
             BufferWrites{kBBytes, {ShadowRange(8192, kBBytes - 8192), ShadowRange(1024, 4096)}}}};
  }
  static bool Written(int64_t offset) {
    const int64_t r = offset - kB;
    return offset < kA || (r >= 1024 && r < 1024 + 4096) || (r >= 8192 && r < kBBytes);
  }
  void WriteShadows(const ShadowSet& set, uint8_t value) {
    for (const auto& [name, w] : Writes()) {
      auto* base =
          static_cast<uint8_t*>(set.registry().Find(exec::BufferSide::kDestination, name)->data);
      for (const v1::TensorView& v : w.views) {
        std::vector<uint8_t> bytes(static_cast<size_t>(v.shape(0)), value);
        f().Write(base + v.byte_offset(), bytes.data(), bytes.size());
      }
    }
  }
  // Every byte of arena `i`: `written` where a sync writes, `other`
  // elsewhere, except [kA, kA + 16) when `owner` >= 0.
  void ExpectArena(int i, uint8_t written, uint8_t other, int owner, const std::string& when) {
    const plane::SwapArena& a = *pair_[i];
    const std::vector<uint8_t> got = f().Download(a.base(), static_cast<size_t>(a.bytes()));
    for (int64_t k = 0; k < a.bytes(); ++k) {
      const int want = owner >= 0 && k >= kA && k < kA + 16 ? owner : Written(k) ? written : other;
      ASSERT_EQ(got[k], want) << when << ": arena " << i << " byte " << k;
    }
  }
  // One staged sync of `version` through `set`, committed and handed over
  // as the runner and the owner do; the owner writes unsynced bytes of the
  // arena it serves between Prepare and Commit.
  void SyncAndFlip(ShadowSet& set, uint8_t version) {
    ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
    ASSERT_STREQ(set.commit_kind(), "flip");
    WriteShadows(set, version);
    Set(*pair_[serving_], kA, 16, 50 + version);
    ASSERT_TRUE(set.Commit().ok());
    ASSERT_EQ(set.flipped().from, pair_[serving_]);
    ASSERT_EQ(set.flipped().to, pair_[1 - serving_]);
    arenas_->Flipped(set.flipped().to.get(), absl::StrCat("sync-", int{version}));
    Serve(1 - serving_);
  }

  std::unique_ptr<WeightArenas> arenas_;
  std::vector<std::shared_ptr<plane::SwapArena>> pair_;
  std::vector<int64_t> handles_;
  int serving_ = 0;
  exec::BufferRegistry live_;
};

TEST_P(ShadowFlipTest, CommitsByHandingOverThePartnerKeepingUnwrittenBytes) {
  ShadowSet set(&f().backend(), /*budget_bytes=*/1, arenas_.get());
  for (uint8_t version = 2; version < 7; ++version) {
    const int from = serving_;
    ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
    EXPECT_STREQ(set.commit_kind(), "flip");
    EXPECT_EQ(set.bytes(), 0) << "the partner is the owner's memory: nothing is allocated";
    const auto* shadow_a = set.registry().Find(exec::BufferSide::kDestination, "inference/a");
    const auto* shadow_b = set.registry().Find(exec::BufferSide::kDestination, "inference/b");
    EXPECT_EQ(shadow_a->data, pair_[1 - from]->base());
    EXPECT_EQ(static_cast<uint8_t*>(shadow_b->data), At(*pair_[1 - from], kB));
    WriteShadows(set, version);
    const int owner_before = version == 2 ? -1 : 50 + version - 1;
    ExpectArena(from, version - 1, 1, owner_before, "the owner serves V-1, whole, until the flip");
    Set(*pair_[from], kA, 16, 50 + version);
    ASSERT_TRUE(set.Commit().ok());
    EXPECT_GE(set.last_commit_times().copy_s, 0);
    ASSERT_EQ(set.flipped().to, pair_[1 - from]);
    ExpectArena(1 - from, version, 1, 50 + version, "the partner after the commit");
    ExpectArena(from, version - 1, 1, 50 + version, "the arena left is untouched");
    arenas_->Flipped(set.flipped().to.get(), "sync");
    ASSERT_TRUE(arenas_->Ack(handles_[1 - from]).ok());
    Serve(1 - from);
  }
}

TEST_P(ShadowFlipTest, ThePartnerIsWrittenOnlyAfterTheOwnerAcknowledgedTheLastFlip) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  SyncAndFlip(set, 2);
  // The owner still reads the arena it left: nothing may be written there.
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "worker 3")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "sync-2")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "weights.1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "AckFlip")) << s;
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  ExpectArena(0, 1, 1, 52, "the arena the owner still reads");
  // An acknowledgement during the wait lets the sync go on.
  std::thread owner([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(arenas_->Ack(handles_[1]).ok());
  });
  s = set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3");
  owner.join();
  // 200 ms wait, ack after 50 ms.
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(set.registry().Find(exec::BufferSide::kDestination, "inference/a")->data,
            pair_[0]->base());
}

TEST_P(ShadowFlipTest, ALiveRegistryInTheArenaLeftIsRefusedNotWrittenOver) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  SyncAndFlip(set, 2);
  ASSERT_TRUE(arenas_->Ack(handles_[1]).ok());
  // The owner serves arena 1; a registration pointing back at arena 0 would
  // make the next sync write arena 1 under the owner.
  Serve(0);
  absl::Status s = set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "weights.0")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "sync-2")) << s;
  ExpectArena(1, 2, 1, 52, "the arena the owner serves");
  EXPECT_FALSE(arenas_->CheckNotLeft(At(*pair_[0], 8), "w", "tensor 'x'").ok());
  EXPECT_TRUE(arenas_->CheckNotLeft(At(*pair_[1], 8), "w", "tensor 'x'").ok());
}

TEST_P(ShadowFlipTest, AFreedPartnerStopsTheSyncAndMovesNothing) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  // Freed between Prepare and Commit: the commit refuses, live untouched.
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 2);
  ASSERT_TRUE(arenas_->Free(handles_[1]).ok());
  absl::Status s = set.Commit();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "nothing moved")) << s;
  EXPECT_EQ(set.flipped().to, nullptr);
  ExpectArena(0, 1, 1, -1, "live after a refused flip commit");
}

TEST_P(ShadowFlipTest, FreeingTheArenaAwaitedEndsTheWait) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  SyncAndFlip(set, 2);
  WeightArenas* arenas = arenas_.get();
  const int64_t left = handles_[0];
  std::thread owner([arenas, left] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(arenas->Free(left).ok());
  });
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3");
  owner.join();
  // Arena 1 has no partner now: the sync commits by swap, never into the freed arena.
  if (s.ok()) {
    EXPECT_STREQ(set.commit_kind(), "swap");
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  }
}

TEST_P(ShadowFlipTest, AStoppingWorkerEndsTheWaitForTheOwner) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  SyncAndFlip(set, 2);
  std::thread stop([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    arenas_->Close();
  });
  absl::Status s = set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3");
  stop.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "sync-2")) << s;
}

TEST_P(ShadowFlipTest, ARolledBackSyncLeavesTheServedArenaAndTheNextOneFlipsWhole) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 9);
  set.Discard();  // rolled back: the partner holds part of version 9
  ExpectArena(0, 1, 1, -1, "served after the rollback");
  SyncAndFlip(set, 3);
  ExpectArena(1, 3, 1, 53, "flipped onto after the rollback");
  ExpectArena(0, 1, 1, 53, "left");
}

TEST_P(ShadowFlipTest, AcknowledgementsAreCheckedAndAFreedPartnerEndsThePair) {
  EXPECT_EQ(arenas_->Ack(999).code(), absl::StatusCode::kNotFound);
  absl::Status none = arenas_->Ack(handles_[1]);
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "weights.1")) << none;
  ShadowSet set(&f().backend(), 0, arenas_.get());
  SyncAndFlip(set, 2);
  absl::Status back = arenas_->Ack(handles_[0]);  // the arena left, not the one flipped onto
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition) << back;
  ASSERT_TRUE(arenas_->Ack(handles_[1]).ok());
  EXPECT_EQ(arenas_->Ack(handles_[1]).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(arenas_->Free(handles_[0]).ok());
  EXPECT_EQ(arenas_->PartnerOf(pair_[1].get()), nullptr);
  // Arena 1 alone: the next staged sync commits by swapping it with a twin.
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_STREQ(set.commit_kind(), "swap");
}

}  // namespace wsync::agent

#endif  // WSYNC_TESTS_WORKER_AGENT_SHADOW_FLIP_SUITE_H_
