// Staged syncs on the worker (docs/staging.md): the shadow copies (over the
// host backend) and the gate where a staged receiver waits for the pool's
// decision.
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent/shadow_set.h"
#include "worker/agent/staged_gate.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

using ::testing::HasSubstr;

class ShadowSetTest : public ::testing::Test {
 protected:
  ShadowSetTest() : live_w_(64, 1), live_b_(16, 2) {
    Register("inference/w", live_w_);
    Register("inference/b", live_b_);
    exec::RegisteredBuffer src{source_.data(), 8, v1::UINT8};
    EXPECT_TRUE(live_.Register(exec::BufferSide::kSource, "trainer/x", src).ok());
  }
  void Register(const std::string& name, std::vector<unsigned char>& v) {
    exec::RegisteredBuffer b{v.data(), static_cast<int64_t>(v.size()), v1::UINT8};
    EXPECT_TRUE(live_.Register(exec::BufferSide::kSource, name, b).ok());
    EXPECT_TRUE(live_.Register(exec::BufferSide::kDestination, name, b).ok());
  }
  unsigned char* Shadow(ShadowSet& s, const std::string& name) {
    const exec::RegisteredBuffer* b = s.registry().Find(exec::BufferSide::kDestination, name);
    return b == nullptr ? nullptr : static_cast<unsigned char*>(b->data);
  }

  host::HostBackend backend_{plane::BackendConfig()};
  std::vector<unsigned char> live_w_, live_b_, source_ = std::vector<unsigned char>(8, 9);
  exec::BufferRegistry live_;
  // Byte views of a UINT8 buffer.
  static v1::TensorView Range(int64_t offset, int64_t bytes) {
    v1::TensorView v;
    v.set_byte_offset(offset);
    v.add_shape(bytes);
    v.add_strides(1);
    v.set_dtype(v1::UINT8);
    v.set_side(v1::DESTINATION_BUFFER);
    return v;
  }
  static BufferWrites Whole(int64_t bytes) { return BufferWrites{bytes, {Range(0, bytes)}}; }

  const std::map<std::string, BufferWrites> extents_{{"inference/w", Whole(48)},
                                                     {"inference/b", Whole(16)}};
};

TEST_F(ShadowSetTest, WritesGoToShadowsFilledFromLiveAndCommitCopiesThemIn) {
  ShadowSet set(&backend_, 0);
  ASSERT_TRUE(set.Prepare(extents_, v1::STAGING_HOST_SHADOW, live_, "worker 2").ok());
  EXPECT_EQ(set.bytes(), 64);
  unsigned char* w = Shadow(set, "inference/w");
  ASSERT_NE(w, nullptr);
  EXPECT_NE(w, live_w_.data());
  EXPECT_EQ(set.registry().Find(exec::BufferSide::kDestination, "inference/w")->bytes, 48);
  // The source side and other buffers stay the live ones.
  EXPECT_EQ(set.registry().Find(exec::BufferSide::kSource, "inference/w")->data, live_w_.data());
  EXPECT_EQ(set.registry().Find(exec::BufferSide::kSource, "trainer/x")->data, source_.data());
  EXPECT_EQ(w[0], 1);  // filled from live
  std::memset(w, 7, 48);
  std::memset(Shadow(set, "inference/b"), 8, 16);
  EXPECT_EQ(live_w_[0], 1) << "the live tensor keeps serving the old bytes";
  ASSERT_TRUE(set.Commit().ok());
  EXPECT_EQ(live_w_[0], 7);
  EXPECT_EQ(live_w_[47], 7);
  EXPECT_EQ(live_w_[48], 1) << "past the extent the plan writes: untouched";
  EXPECT_EQ(live_b_[15], 8);
}

TEST_F(ShadowSetTest, ADiscardedShadowIsRefilledFromLiveBeforeItsNextUse) {
  ShadowSet set(&backend_, 0);
  ASSERT_TRUE(set.Prepare(extents_, v1::STAGING_DEVICE_SHADOW, live_, "worker 2").ok());
  const uint64_t generation = set.generation();
  std::memset(Shadow(set, "inference/w"), 5, 10);  // a rolled-back sync's partial write
  set.Discard();
  ASSERT_TRUE(set.Prepare(extents_, v1::STAGING_DEVICE_SHADOW, live_, "worker 2").ok());
  EXPECT_EQ(set.generation(), generation) << "same buffers: kept, not reallocated";
  EXPECT_EQ(Shadow(set, "inference/w")[0], 1) << "refilled: the partial write is gone";
  ASSERT_TRUE(set.Commit().ok());
  EXPECT_EQ(live_w_[0], 1);
}

TEST_F(ShadowSetTest, CommitCopiesOnlyTheWrittenViewsWhateverElseWroteTheLiveBuffer) {
  ShadowSet set(&backend_, 0);
  // Bytes [0, 8), [32, 48) and a strided 2x2 view at 16 (16, 17, 24, 25).
  v1::TensorView strided = Range(16, 2);
  strided.clear_shape();
  strided.clear_strides();
  for (int64_t d : {2, 2}) strided.add_shape(d);
  for (int64_t d : {8, 1}) strided.add_strides(d);
  const std::map<std::string, BufferWrites> writes{
      {"inference/w", BufferWrites{48, {Range(32, 16), strided, Range(0, 4), Range(4, 4)}}}};
  for (int sync = 0; sync < 2; ++sync) {
    // The second time the shadow is reused (same buffers and extents).
    ASSERT_TRUE(set.Prepare(writes, v1::STAGING_HOST_SHADOW, live_, "worker 2").ok());
    // Another writer (an in-place sync of another transfer, a peer's direct
    // write, the owner) changes the live bytes this plan does not write.
    std::memset(live_w_.data(), 40 + sync, live_w_.size());
    std::memset(Shadow(set, "inference/w"), 7 + sync, 48);
    ASSERT_TRUE(set.Commit().ok());
    EXPECT_EQ(set.commit_bytes(), 8 + 16 + 4);
    for (int i = 0; i < 64; ++i) {
      const bool written = i < 8 || (i >= 32 && i < 48) || i == 16 || i == 17 || i == 24 || i == 25;
      EXPECT_EQ(live_w_[i], written ? 7 + sync : 40 + sync) << "byte " << i << ", sync " << sync;
    }
  }
}

TEST_F(ShadowSetTest, RefusesOverBudgetAndUnknownOrTooSmallBuffersNamingThem) {
  ShadowSet tight(&backend_, 63);
  absl::Status s = tight.Prepare(extents_, v1::STAGING_HOST_SHADOW, live_, "worker inference/0");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("worker inference/0"));
  EXPECT_THAT(s.message(), HasSubstr("--staging_budget_bytes=63"));
  ShadowSet set(&backend_, 0);
  s = set.Prepare({{"inference/w", Whole(65)}}, v1::STAGING_HOST_SHADOW, live_, "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'inference/w' but it has 64 bytes"));
  s = set.Prepare({{"inference/nope", Whole(4)}}, v1::STAGING_HOST_SHADOW, live_, "w");
  EXPECT_THAT(s.message(), HasSubstr("not registered"));
  s = set.Prepare(extents_, v1::STAGING_IN_PLACE, live_, "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagedGateTest, CommitAbortEarlyDecisionsAndTheDeadline) {
  StagedGate gate;
  gate.Arm("s1", 1);
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Commit("other");  // another sync's decision does not count
    gate.Commit("s1");
  });
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(d.commit);

  gate.Abort("s2", "checksum mismatch");  // before the staged report: kept
  gate.Arm("s2", 1);
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.reason, "checksum mismatch");

  gate.Arm("s3", 1);
  gate.Abort("", "lease lost");  // whatever is armed
  gate.Commit("s3");             // too late: decided
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);

  gate.Abort("", "nothing armed: ignored");
  gate.Arm("s4", 1);
  d = gate.Wait(absl::Now() + absl::Milliseconds(30));
  EXPECT_FALSE(d.commit);
  EXPECT_THAT(d.reason, HasSubstr("deadline"));
}

TEST(StagedGateTest, PollNeverBlocksAndTheWakerRunsOnEachDecisionOfTheArmedSync) {
  StagedGate gate;
  int wakes = 0;
  gate.SetWaker([&] { ++wakes; });
  gate.Arm("s1", 1);
  EXPECT_FALSE(gate.Poll(absl::Now() + absl::Seconds(10)).has_value()) << "undecided";
  gate.Commit("other");  // another sync's: kept for its Arm, no wake
  EXPECT_EQ(wakes, 0);
  gate.Commit("s1");
  EXPECT_EQ(wakes, 1);
  gate.Commit("s1");  // decided already: no second wake
  EXPECT_EQ(wakes, 1);
  std::optional<StagedGate::Decision> d = gate.Poll(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->commit);
  gate.Finished("s1", /*committed=*/true);

  gate.Arm("s2", 1);
  gate.Abort("", "the worker is stopping");
  EXPECT_EQ(wakes, 2);
  d = gate.Poll(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(d->commit);

  gate.Arm("s3", 1);
  EXPECT_EQ(gate.Rejoined(2, {}, "not listed").size(), 0u);
  EXPECT_EQ(wakes, 3) << "a registration that decides wakes too";
  EXPECT_FALSE(gate.Poll(absl::InfinitePast())->commit);

  gate.Arm("s4", 2);
  d = gate.Poll(absl::InfinitePast());  // past its deadline: decided, no commit
  ASSERT_TRUE(d.has_value());
  EXPECT_THAT(d->reason, HasSubstr("deadline"));
  EXPECT_EQ(wakes, 3);
}

TEST(StagedGateTest, ARegistrationAfterARestartCommitsTheListedSyncAndRollsBackAnUnlistedOne) {
  using Held = StagedGate::Held;
  StagedGate gate;
  // s1 committed earlier; s2 staged and awaiting when the controller died.
  gate.Arm("s1", 1);
  gate.Commit("s1");
  ASSERT_TRUE(gate.Wait(absl::Now() + absl::Seconds(10)).commit);
  gate.Finished("s1", /*committed=*/true);
  gate.Arm("s2", 1);
  std::vector<Held> held;
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    held = gate.Rejoined(2, {"s2", "s1", "s0"}, "not decided");
  });
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(d.commit) << "s2's decision was listed: it commits";
  EXPECT_EQ(held, (std::vector<Held>{Held::kAwaiting, Held::kCommitted, Held::kNothing}));
  // Committing (between Wait and Finished): its own report follows.
  EXPECT_EQ(gate.Rejoined(3, {"s2"}, "x"), std::vector<Held>{Held::kCommitting});
  gate.Finished("s2", /*committed=*/false);  // the copy failed: nothing to confirm
  EXPECT_EQ(gate.Rejoined(4, {"s2"}, "x"), std::vector<Held>{Held::kNothing});

  // Not listed: the controller has no decision for it, it rolls back.
  gate.Arm("s3", 4);
  EXPECT_TRUE(gate.Rejoined(5, {"other"}, "instance b has no decision").size() == 1);
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.reason, "instance b has no decision");
  // A rolled-back sync listed later: held nothing (it must sync again).
  EXPECT_EQ(gate.Rejoined(6, {"s3"}, "x"), std::vector<Held>{Held::kNothing});
}

TEST(StagedGateTest, AStagedReportRacingARegistrationIsDecidedByThatRegistrationWhateverTheOrder) {
  // Review finding (session 14): the worker rolled back a sync whose lease
  // had been replaced by the time it checked, before the new registration's
  // word (which may list the sync as decided) was heard.
  StagedGate gate;
  // Report out under epoch 1, registered again (epoch 2) before the word of
  // the new registration: it lists the sync, which commits.
  gate.Arm("s1", 1);
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Rejoined(2, {"s1"}, "not decided");
  });
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(d.commit) << d.reason;
  gate.Finished("s1", true);

  // The registration of epoch 3 was heard before the sync of epoch 2 was
  // armed: its report goes to a replaced lease, no decision can come, and
  // it rolls back at once rather than at its deadline.
  gate.Rejoined(3, {}, "not decided");
  gate.Arm("s2", 2);
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);
  EXPECT_THAT(d.reason, HasSubstr("registered again (lease epoch 3) before its staged report"));

  // Armed under the current epoch: a registration of the same epoch (heard
  // before the sync arrived) decides nothing for it.
  gate.Arm("s3", 3);
  EXPECT_EQ(gate.Rejoined(3, {"s3"}, "x"),
            std::vector<StagedGate::Held>{StagedGate::Held::kNothing});
  gate.Commit("s3");
  EXPECT_TRUE(gate.Wait(absl::Now() + absl::Seconds(10)).commit);
}

TEST(StagedGateTest, ASyncListedToAwaitItsWaveKeepsItsShadowUntilItsCommitSync) {
  // Rolling waves (docs/staging.md): a restarted controller lists the sync
  // with await_commit; the receiver neither commits nor rolls back until
  // the CommitSync of its wave.
  using Held = StagedGate::Held;
  StagedGate gate;
  gate.Arm("s1", 1);
  EXPECT_EQ(gate.Rejoined(2, {"s1"}, "not decided", /*later=*/{"s1"}),
            std::vector<Held>{Held::kWaiting});
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Milliseconds(30));
  EXPECT_FALSE(d.commit) << "nothing decided it yet: only the deadline ends the wait";
  EXPECT_THAT(d.reason, HasSubstr("deadline"));
  gate.Arm("s2", 3);
  EXPECT_EQ(gate.Rejoined(4, {"s2"}, "not decided", {"s2"}), std::vector<Held>{Held::kWaiting});
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Commit("s2");  // its wave's CommitSync
  });
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(d.commit);
}

TEST(StagedGateTest, ACommitHeardWhileHeldIsDroppedWhenArmedAgainAfterTheAdmission) {
  // docs/staging.md, "An owner holding syncs off": a held rank re-armed
  // after its owner admitted syncs awaits the CommitSync its whole
  // replica's wave sends; a stale one heard while held never commits it,
  // an abort heard meanwhile still counts.
  StagedGate gate;
  gate.Commit("s1");  // heard while held (not armed)
  gate.Arm("s1", 1, /*keep_early_commit=*/false);
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Milliseconds(30));
  EXPECT_FALSE(d.commit) << "a CommitSync heard while held committed after the admission";
  gate.Abort("s2", "deadline passed");
  gate.Arm("s2", 1, /*keep_early_commit=*/false);
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.reason, "deadline passed");
  gate.Commit("s3");
  gate.Arm("s3", 1);  // the default keeps an early commit (a CommitSync racing Arm)
  EXPECT_TRUE(gate.Wait(absl::Now() + absl::Seconds(10)).commit);
}

}  // namespace
}  // namespace wsync::agent
