// Swap commits through ShadowSet (docs/commit-swap.md), for any backend with
// remappable arenas: tests/worker/agent/shadow_swap_test.cc runs it over the
// host backend in CPU CI, tests/gpu/shadow_swap_cuda_test.cc over CUDA. A
// binary implements ShadowSwapFactory (the backend, and TestMemory's
// Read/Write into its memory) and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Host, ShadowSwapTest,
//                            ::testing::Values(std::make_shared<HostSwap>()),
//                            ShadowSwapTest::ParamName);
//
// The arena holds two destination buffers, "inference/a" at 0 and
// "inference/b" at kB, and bytes no sync writes (before kB, after b).
#ifndef WSYNC_TESTS_WORKER_AGENT_SHADOW_SWAP_SUITE_H_
#define WSYNC_TESTS_WORKER_AGENT_SHADOW_SWAP_SUITE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/plane/plane_test_memory.h"
#include "worker/agent/shadow_set.h"
#include "worker/agent/weight_arenas.h"

namespace wsync::agent {

// `bytes` bytes of a destination buffer from `offset`, as a uint8 view.
inline v1::TensorView ShadowRange(int64_t offset, int64_t bytes) {
  v1::TensorView v;
  v.set_byte_offset(offset);
  v.add_shape(bytes);
  v.add_strides(1);
  v.set_dtype(v1::UINT8);
  v.set_side(v1::DESTINATION_BUFFER);
  return v;
}

class ShadowSwapFactory : public plane::conformance::TestMemory {
 public:
  virtual std::string Name() const = 0;
  virtual plane::Backend& backend() = 0;
  virtual transport::MemorySpace space() const = 0;
};

class ShadowSwapTest : public ::testing::TestWithParam<std::shared_ptr<ShadowSwapFactory>> {
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
    arenas_ = std::make_unique<WeightArenas>(&f().backend());
    auto e = arenas_->Create(kB + kBBytes + 1000, "weights", "test worker");
    ASSERT_TRUE(e.ok()) << e.status();
    arena_ = e->arena;
    Set(0, arena_->bytes(), 1);
    Register(live_);
  }
  ShadowSwapFactory& f() { return *GetParam(); }
  uint8_t* At(int64_t offset) const { return static_cast<uint8_t*>(arena_->base()) + offset; }
  void Set(int64_t offset, int64_t bytes, uint8_t value) { Fill(At(offset), bytes, value); }
  void Fill(uint8_t* p, int64_t bytes, uint8_t value) {
    std::vector<uint8_t> v(static_cast<size_t>(bytes), value);
    f().Write(p, v.data(), v.size());
  }
  // Registers the two buffers in `reg` (a new generation).
  void Register(exec::BufferRegistry& reg) {
    const std::vector<std::tuple<std::string, int64_t, int64_t>> buffers = {
        {"inference/a", 0, kA}, {"inference/b", kB, kBBytes}};
    for (const auto& [name, offset, bytes] : buffers) {
      exec::RegisteredBuffer b{At(offset), bytes, v1::UINT8, f().space()};
      (void)reg.Unregister(exec::BufferSide::kDestination, name);
      ASSERT_TRUE(reg.Register(exec::BufferSide::kDestination, name, b).ok());
    }
  }
  static v1::TensorView Range(int64_t offset, int64_t bytes) { return ShadowRange(offset, bytes); }
  // a whole; b's bytes [1024, 1024 + 4096) and [8192, kBBytes).
  std::map<std::string, BufferWrites> Writes() const {
    return {
        {"inference/a", BufferWrites{kA, {Range(0, kA)}}},
        {"inference/b", BufferWrites{kBBytes, {Range(8192, kBBytes - 8192), Range(1024, 4096)}}}};
  }
  static bool Written(int64_t offset) {
    const int64_t r = offset - kB;
    return offset < kA || (r >= 1024 && r < 1024 + 4096) || (r >= 8192 && r < kBBytes);
  }
  // What the sync writes: `value` into every written view of the shadows.
  void WriteShadows(const ShadowSet& set, uint8_t value) { WriteShadows(set, Writes(), value); }
  void WriteShadows(const ShadowSet& set, const std::map<std::string, BufferWrites>& writes,
                    uint8_t value) {
    for (const auto& [name, w] : writes) {
      auto* base =
          static_cast<uint8_t*>(set.registry().Find(exec::BufferSide::kDestination, name)->data);
      for (const v1::TensorView& v : w.views) Fill(base + v.byte_offset(), v.shape(0), value);
    }
  }
  // Every arena byte: `written` where the sync writes, `other` elsewhere.
  void ExpectLive(uint8_t written, uint8_t other, const std::string& when) {
    const std::vector<uint8_t> got =
        f().Download(arena_->base(), static_cast<size_t>(arena_->bytes()));
    for (int64_t i = 0; i < arena_->bytes(); ++i) {
      ASSERT_EQ(got[i], Written(i) ? written : other) << when << ": byte " << i;
    }
  }

  std::unique_ptr<WeightArenas> arenas_;
  std::shared_ptr<plane::SwapArena> arena_;
  exec::BufferRegistry live_;
};

TEST_P(ShadowSwapTest, CommitsBySwappingAtTheSameAddressesKeepingUnwrittenBytes) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  void* const base = arena_->base();
  for (uint8_t version = 2; version < 6; ++version) {
    ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
    EXPECT_STREQ(set.commit_kind(), "swap");
    EXPECT_EQ(set.bytes(), arena_->bytes()) << "the whole twin counts";
    const auto* shadow_b = set.registry().Find(exec::BufferSide::kDestination, "inference/b");
    const auto* shadow_a = set.registry().Find(exec::BufferSide::kDestination, "inference/a");
    EXPECT_EQ(static_cast<uint8_t*>(shadow_b->data) - static_cast<uint8_t*>(shadow_a->data), kB);
    EXPECT_FALSE(arena_->Contains(shadow_a->data, 1));
    WriteShadows(set, version);
    ExpectLive(version - 1, 1, "live serves V-1 until the commit");
    // The owner writes bytes no sync writes between Prepare and Commit:
    // the commit keeps them.
    Set(kA, 16, 50 + version);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(set.Commit().ok());
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Where the pause went: the complement's copy and the remap, within it.
    const ShadowSet::CommitTimes& times = set.last_commit_times();
    EXPECT_GT(times.copy_s, 0);
    EXPECT_GT(times.swap_s, 0);
    EXPECT_LE(times.wait_ops_s + times.copy_s + times.swap_s, wall);
    EXPECT_EQ(arena_->base(), base);
    EXPECT_EQ(f().Download(At(kA), 16),
              std::vector<uint8_t>(16, static_cast<uint8_t>(50 + version)));
    Set(kA, 16, 1);
    ExpectLive(version, 1, "after the swap");
  }
}

TEST_P(ShadowSwapTest, ADiscardLeavesLiveAndTheNextSyncSwapsAgain) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 2);
  ASSERT_TRUE(set.Commit().ok());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 3);
  set.Discard();
  ExpectLive(2, 1, "after the rollback");
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  WriteShadows(set, 4);
  ASSERT_TRUE(set.Commit().ok());
  ExpectLive(4, 1, "after the next commit");
}

TEST_P(ShadowSwapTest, ANewRegistrationGetsANewTwinAndStillSwaps) {
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  const uint64_t generation = set.generation();
  WriteShadows(set, 2);
  ASSERT_TRUE(set.Commit().ok());
  Register(live_);
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_NE(set.generation(), generation);
  EXPECT_STREQ(set.commit_kind(), "swap");
  WriteShadows(set, 3);
  ASSERT_TRUE(set.Commit().ok());
  ExpectLive(3, 1, "after a commit through the new twin");
}

TEST_P(ShadowSwapTest, ATwinOverTheBudgetIsRefusedNamingTheWorkerAndArena) {
  ShadowSet set(&f().backend(), kA + kBBytes, arenas_.get());  // the extents fit, the twin not
  const absl::Status s = set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  for (const char* part : {"worker 3", "swap commit", "'weights'", "--staging_budget_bytes"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s;
  }
  ExpectLive(1, 1, "refused");
}

TEST_P(ShadowSwapTest, CopiesWhenTheBuffersAreNotInOneArena) {
  auto other = f().backend().NewSwapArena(kBBytes, "other");
  ASSERT_TRUE(other.ok()) << other.status();
  exec::BufferRegistry split = live_;
  exec::RegisteredBuffer b{(*other)->base(), kBBytes, v1::UINT8, f().space()};
  ASSERT_TRUE(split.Unregister(exec::BufferSide::kDestination, "inference/b").ok());
  ASSERT_TRUE(split.Register(exec::BufferSide::kDestination, "inference/b", b).ok());
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, split, "worker 3").ok());
  EXPECT_STREQ(set.commit_kind(), "copy") << "b lies in an arena the owner did not register";
  ShadowSet no_arenas(&f().backend(), 0);
  ASSERT_TRUE(no_arenas.Prepare(Writes(), v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_STREQ(no_arenas.commit_kind(), "copy");
  ASSERT_TRUE(no_arenas.Commit().ok());
  EXPECT_GT(no_arenas.last_commit_times().copy_s, 0);
  EXPECT_EQ(no_arenas.last_commit_times().swap_s, 0) << "a copy commit remaps nothing";
}

// Two consecutive syncs writing different views of the same buffers (same
// extents: the twin is kept). After the first swap the twin holds V-1, not
// V; the second sync writes only its views, and its commit brings every
// other byte from live (V), so nothing of V-1 comes back. Then a rolled back
// sync writing yet other views, and a fourth that commits.
TEST_P(ShadowSwapTest, SyncsWritingDifferentViewsKeepEveryByteOfTheLastVersion) {
  const auto a_head = [] { return BufferWrites{kA, {Range(0, kA - 1024)}}; };
  const auto a_tail = [] { return BufferWrites{kA, {Range(kA - 1024, 1024)}}; };
  const auto b_tail = [] { return BufferWrites{kBBytes, {Range(kBBytes - 4096, 4096)}}; };
  const auto b_mid = [] {
    return BufferWrites{kBBytes, {Range(1024, 4096), Range(kBBytes - 1, 1)}};
  };
  const std::vector<std::map<std::string, BufferWrites>> syncs = {
      Writes(),                                                // V2: every written view
      {{"inference/a", a_tail()}, {"inference/b", b_tail()}},  // V3
      {{"inference/a", a_head()}, {"inference/b", b_mid()}},   // V4, rolled back
      {{"inference/a", a_tail()}, {"inference/b", b_mid()}},   // V5
  };
  // Expected live bytes, by offset, after each commit.
  std::vector<uint8_t> want(static_cast<size_t>(arena_->bytes()), 1);
  auto apply = [&](const std::map<std::string, BufferWrites>& writes, uint8_t value) {
    for (const auto& [name, w] : writes) {
      const int64_t base = name == "inference/a" ? 0 : kB;
      for (const v1::TensorView& v : w.views) {
        std::fill_n(want.begin() + base + v.byte_offset(), v.shape(0), value);
      }
    }
  };
  ShadowSet set(&f().backend(), 0, arenas_.get());
  uint64_t generation = 0;
  for (size_t i = 0; i < syncs.size(); ++i) {
    const uint8_t version = static_cast<uint8_t>(2 + i);
    SCOPED_TRACE(absl::StrCat("version ", version));
    ASSERT_TRUE(set.Prepare(syncs[i], v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
    EXPECT_STREQ(set.commit_kind(), "swap");
    if (i > 0) EXPECT_EQ(set.generation(), generation) << "the twin is kept";
    generation = set.generation();
    WriteShadows(set, syncs[i], version);
    if (i == 2) {
      set.Discard();
      continue;
    }
    ASSERT_TRUE(set.Commit().ok());
    apply(syncs[i], version);
    const std::vector<uint8_t> got =
        f().Download(arena_->base(), static_cast<size_t>(arena_->bytes()));
    for (int64_t k = 0; k < arena_->bytes(); ++k) {
      ASSERT_EQ(got[k], want[k]) << "byte " << k;
    }
  }
}

// A view of many tiny runs (one byte of every 4, 2048 of them: a column)
// commits by copy, saying why, instead of listing thousands of runs; the
// copy commit writes it right. Overlapping views swap, the complement
// counting each byte once.
TEST_P(ShadowSwapTest, TinyRunsCommitByCopyAndOverlappingViewsSwap) {
  v1::TensorView column = Range(0, 0);
  column.clear_shape();
  column.clear_strides();
  for (int64_t d : {int64_t{2048}, int64_t{1}}) column.add_shape(d);
  for (int64_t d : {int64_t{4}, int64_t{1}}) column.add_strides(d);
  {
    ShadowSet set(&f().backend(), 0, arenas_.get());
    const std::map<std::string, BufferWrites> writes = {
        {"inference/b", BufferWrites{4 * 2047 + 1, {column}}}};
    ASSERT_TRUE(set.Prepare(writes, v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
    EXPECT_STREQ(set.commit_kind(), "copy");
    for (const char* part : {"view 0 of 'inference/b'", "'weights'", "2048 runs of 1 bytes"}) {
      EXPECT_NE(set.copy_reason().find(part), std::string::npos)
          << part << " in " << set.copy_reason();
    }
    auto* shadow = static_cast<uint8_t*>(
        set.registry().Find(exec::BufferSide::kDestination, "inference/b")->data);
    for (int64_t i = 0; i < 2048; ++i) Fill(shadow + 4 * i, 1, 7);
    ASSERT_TRUE(set.Commit().ok());
    const std::vector<uint8_t> got = f().Download(At(kB), 4 * 2048);
    for (int64_t i = 0; i < 4 * 2048; ++i) ASSERT_EQ(got[i], i % 4 == 0 ? 7 : 1) << i;
    Set(kB, 4 * 2048, 1);
  }
  ShadowSet set(&f().backend(), 0, arenas_.get());
  const std::map<std::string, BufferWrites> overlapping = {
      {"inference/b",
       BufferWrites{kBBytes, {Range(0, 4096), Range(2048, 4096), Range(1024, 512)}}}};
  ASSERT_TRUE(set.Prepare(overlapping, v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_STREQ(set.commit_kind(), "swap");
  EXPECT_EQ(set.copy_reason(), "");
  EXPECT_EQ(set.commit_bytes(), arena_->bytes() - 6144) << "the union of the views is 6144 bytes";
  WriteShadows(set, overlapping, 8);
  ASSERT_TRUE(set.Commit().ok());
  const std::vector<uint8_t> got =
      f().Download(arena_->base(), static_cast<size_t>(arena_->bytes()));
  for (int64_t i = 0; i < arena_->bytes(); ++i) {
    ASSERT_EQ(got[i], i >= kB && i < kB + 6144 ? 8 : 1) << "byte " << i;
  }
}

// A strided view (4 rows of 256 bytes, 1024 apart, in b at 16 KiB: a fan-out
// chunk of stacked experts over part of their rows) swaps; the bytes between
// its rows come from live.
TEST_P(ShadowSwapTest, AStridedViewSwapsAndKeepsTheBytesBetweenItsRows) {
  constexpr int64_t kAt = 16 << 10, kRows = 4, kRow = 256, kPitch = 1024;
  v1::TensorView v = Range(kAt, 0);
  v.clear_shape();
  v.clear_strides();
  for (int64_t d : {kRows, kRow}) v.add_shape(d);
  for (int64_t d : {kPitch, int64_t{1}}) v.add_strides(d);
  std::map<std::string, BufferWrites> writes = {{"inference/b", BufferWrites{kBBytes, {v}}}};
  ShadowSet set(&f().backend(), 0, arenas_.get());
  ASSERT_TRUE(set.Prepare(writes, v1::STAGING_DEVICE_SHADOW, live_, "worker 3").ok());
  EXPECT_STREQ(set.commit_kind(), "swap");
  EXPECT_EQ(set.commit_bytes(), arena_->bytes() - kRows * kRow) << "all but the rows";
  auto* shadow = static_cast<uint8_t*>(
      set.registry().Find(exec::BufferSide::kDestination, "inference/b")->data);
  // What the twin held (the live bytes at Prepare) in a gap: the commit must
  // not keep it: the owner writes the gaps between Prepare and Commit.
  for (int64_t r = 0; r < kRows; ++r) Fill(shadow + kAt + r * kPitch, kRow, 9);
  Set(kB + kAt + kRow, kPitch - kRow, 4);  // the gap after row 0, in live
  ASSERT_TRUE(set.Commit().ok());
  const std::vector<uint8_t> got =
      f().Download(arena_->base(), static_cast<size_t>(arena_->bytes()));
  for (int64_t i = 0; i < arena_->bytes(); ++i) {
    const int64_t r = i - kB - kAt;
    const bool row = r >= 0 && r < kRows * kPitch && r % kPitch < kRow;
    const bool gap0 = r >= kRow && r < kPitch;
    ASSERT_EQ(got[i], row ? 9 : gap0 ? 4 : 1) << "byte " << i;
  }
}

}  // namespace wsync::agent

#endif  // WSYNC_TESTS_WORKER_AGENT_SHADOW_SWAP_SUITE_H_
