// Staged syncs on the worker (docs/staging.md): the shadow copies (over the
// host backend) and the gate where a staged receiver waits for the pool's
// decision.
#include <cstring>
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
  const std::map<std::string, int64_t> extents_{{"inference/w", 48}, {"inference/b", 16}};
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

TEST_F(ShadowSetTest, RefusesOverBudgetAndUnknownOrTooSmallBuffersNamingThem) {
  ShadowSet tight(&backend_, 63);
  absl::Status s = tight.Prepare(extents_, v1::STAGING_HOST_SHADOW, live_, "worker inference/0");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("worker inference/0"));
  EXPECT_THAT(s.message(), HasSubstr("--staging_budget_bytes=63"));
  ShadowSet set(&backend_, 0);
  s = set.Prepare({{"inference/w", 65}}, v1::STAGING_HOST_SHADOW, live_, "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'inference/w' but it has 64 bytes"));
  s = set.Prepare({{"inference/nope", 4}}, v1::STAGING_HOST_SHADOW, live_, "w");
  EXPECT_THAT(s.message(), HasSubstr("not registered"));
  s = set.Prepare(extents_, v1::STAGING_IN_PLACE, live_, "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagedGateTest, CommitAbortEarlyDecisionsAndTheDeadline) {
  StagedGate gate;
  gate.Arm("s1");
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Commit("other");  // another sync's decision does not count
    gate.Commit("s1");
  });
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(d.commit);

  gate.Abort("s2", "checksum mismatch");  // before the staged report: kept
  gate.Arm("s2");
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.reason, "checksum mismatch");

  gate.Arm("s3");
  gate.Abort("", "lease lost");  // whatever is armed
  gate.Commit("s3");             // too late: decided
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);

  gate.Abort("", "nothing armed: ignored");
  gate.Arm("s4");
  d = gate.Wait(absl::Now() + absl::Milliseconds(30));
  EXPECT_FALSE(d.commit);
  EXPECT_THAT(d.reason, HasSubstr("deadline"));
}

TEST(StagedGateTest, ARegistrationAfterARestartCommitsTheListedSyncAndRollsBackAnUnlistedOne) {
  using Held = StagedGate::Held;
  StagedGate gate;
  // s1 committed earlier; s2 staged and awaiting when the controller died.
  gate.Arm("s1");
  gate.Commit("s1");
  ASSERT_TRUE(gate.Wait(absl::Now() + absl::Seconds(10)).commit);
  gate.Finished("s1", /*committed=*/true);
  gate.Arm("s2");
  std::vector<Held> held;
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    held = gate.Rejoined({"s2", "s1", "s0"}, "not decided");
  });
  StagedGate::Decision d = gate.Wait(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(d.commit) << "s2's decision was listed: it commits";
  EXPECT_EQ(held, (std::vector<Held>{Held::kAwaiting, Held::kCommitted, Held::kNothing}));
  // Committing (between Wait and Finished): its own report follows.
  EXPECT_EQ(gate.Rejoined({"s2"}, "x"), std::vector<Held>{Held::kCommitting});
  gate.Finished("s2", /*committed=*/false);  // the copy failed: nothing to confirm
  EXPECT_EQ(gate.Rejoined({"s2"}, "x"), std::vector<Held>{Held::kNothing});

  // Not listed: the controller has no decision for it, it rolls back.
  gate.Arm("s3");
  EXPECT_TRUE(gate.Rejoined({"other"}, "instance b has no decision").size() == 1);
  d = gate.Wait(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.reason, "instance b has no decision");
  // A rolled-back sync listed later: held nothing (it must sync again).
  EXPECT_EQ(gate.Rejoined({"s3"}, "x"), std::vector<Held>{Held::kNothing});
}

}  // namespace
}  // namespace wsync::agent
