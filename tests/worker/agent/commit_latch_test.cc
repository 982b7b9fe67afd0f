// The owner's hold against a staged commit that has just begun
// (worker/agent/commit_latch.h; docs/staging.md, "An owner holding syncs
// off"). Threads are ordered by the latch's test hook and notifications,
// never by sleeps.
#include "worker/agent/commit_latch.h"

#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

using ::testing::HasSubstr;

TEST(CommitLatchTest, AHoldSetWhileACommitWritesWaitsForItAndSaysWhichItWaitedFor) {
  CommitLatch latch;
  absl::Notification waiting;
  latch.SetHoldWaitHookForTest([&] { waiting.Notify(); });
  ASSERT_EQ(latch.TryBegin("s1"), "") << "not held: the commit begins";
  absl::StatusOr<std::string> held;
  absl::Notification returned;
  std::thread owner([&] {
    held = latch.Hold("generating", absl::Hours(1));
    returned.Notify();
  });
  // The hold is set and waits for s1 (bounded: a hold that does not wait
  // never runs the hook).
  const bool waits = waiting.WaitForNotificationWithTimeout(absl::Seconds(30));
  EXPECT_TRUE(waits) << "Hold did not wait for the commit in progress";
  if (waits) {
    EXPECT_FALSE(returned.HasBeenNotified()) << "Hold returned while the commit still writes";
    EXPECT_EQ(latch.held(), "generating") << "held from the moment Hold was called";
    EXPECT_EQ(latch.TryBegin("s2"), "generating") << "no later commit begins";
  }
  latch.End();  // s1's copy ends
  owner.join();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, "s1");
}

TEST(CommitLatchTest, AHoldLiftedWhileItWaitsForACommitSaysItNoLongerHolds) {
  CommitLatch latch;
  absl::Notification waiting;
  latch.SetHoldWaitHookForTest([&] { waiting.Notify(); });
  ASSERT_EQ(latch.TryBegin("s1"), "");
  absl::StatusOr<std::string> held;
  std::thread owner([&] { held = latch.Hold("generating", absl::Hours(1)); });
  ASSERT_TRUE(waiting.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(latch.Hold("", absl::ZeroDuration()).ok()) << "another owner call admits";
  latch.End();
  owner.join();
  EXPECT_EQ(held.status().code(), absl::StatusCode::kAborted) << held.status();
  EXPECT_THAT(held.status().message(), HasSubstr("sync s1"));
  EXPECT_EQ(latch.held(), "");
  EXPECT_EQ(latch.TryBegin("s2"), "") << "admitted: the next commit begins";
}

TEST(CommitLatchTest, AHoldLiftedWhileItOutwaitsItsBoundSaysItNoLongerHolds) {
  CommitLatch latch;
  absl::Notification waiting;
  latch.SetHoldWaitHookForTest([&] { waiting.Notify(); });
  ASSERT_EQ(latch.TryBegin("s1"), "");
  absl::StatusOr<std::string> held;
  std::thread owner([&] { held = latch.Hold("generating", absl::Milliseconds(300)); });
  ASSERT_TRUE(waiting.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(latch.Hold("", absl::ZeroDuration()).ok());
  owner.join();  // s1 never ends: the hold's wait runs out
  EXPECT_EQ(held.status().code(), absl::StatusCode::kAborted) << held.status();
  EXPECT_EQ(latch.held(), "");
  latch.End();
}

TEST(CommitLatchTest, AHoldThatOutwaitsItsBoundSaysTheCommitStillWritesAndStillHolds) {
  CommitLatch latch;
  ASSERT_EQ(latch.TryBegin("s1"), "");
  const absl::StatusOr<std::string> held = latch.Hold("asleep", absl::ZeroDuration());
  ASSERT_EQ(held.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(held.status().message(), HasSubstr("sync s1"));
  EXPECT_THAT(held.status().message(), HasSubstr("--hold_commit_wait"));
  EXPECT_EQ(latch.held(), "asleep");
  latch.End();
  EXPECT_EQ(latch.TryBegin("s2"), "asleep");
}

TEST(CommitLatchTest, AHoldBeforeTheCommitStopsItAndAnAdmissionWakes) {
  CommitLatch latch;
  int wakes = 0;
  latch.SetWaker([&] { ++wakes; });
  auto none = latch.Hold("generating", absl::Hours(1));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "") << "no commit was in progress";
  EXPECT_EQ(latch.TryBegin("s1"), "generating");
  EXPECT_EQ(wakes, 0);
  ASSERT_TRUE(latch.Hold("", absl::Hours(1)).ok());
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(latch.TryBegin("s1"), "");
  // Admitting never waits for the commit in progress.
  auto admitted = latch.Hold("", absl::Hours(1));
  ASSERT_TRUE(admitted.ok());
  EXPECT_EQ(*admitted, "");
}

TEST(CommitLatchTest, AHoldNamesACommitThatBeganAndEndedSinceTheAdmission) {
  // The owner's own wait may end before it learned of a commit that began
  // and ended meanwhile: the hold tells it one ran (its outcome is
  // published), where "" would mean nothing was written.
  CommitLatch latch;
  ASSERT_EQ(latch.TryBegin("s1"), "");
  latch.End();
  auto held = latch.Hold("generating", absl::Hours(1));
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, "s1");
  ASSERT_TRUE(latch.Hold("", absl::Hours(1)).ok());  // admitted: a new window
  held = latch.Hold("generating", absl::Hours(1));
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, "") << "no commit since the admission";
}

}  // namespace
}  // namespace wsync::agent
