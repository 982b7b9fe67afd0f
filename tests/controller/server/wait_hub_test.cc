// WaitHub: waiters polled on notifications, wakes and deadlines from one
// thread, and capped.
#include "controller/server/wait_hub.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

// Answers once `ready` is set or its deadline passed.
class FlagWaiter : public WaitHub::Waiter {
 public:
  bool Poll(bool expired) override {
    ++polls;
    if (!ready.load() && !expired) return false;
    this->expired = expired;
    done.Notify();
    return true;
  }
  std::atomic<bool> ready{false};
  std::atomic<int> polls{0};
  bool expired = false;
  absl::Notification done;
};

TEST(WaitHubTest, NotifyAnswersWaitersAndDeadlinesExpireThem) {
  WaitHub hub(0);
  FlagWaiter notified, timed;
  ASSERT_TRUE(hub.Add(&notified, absl::InfiniteFuture()).ok());
  ASSERT_TRUE(hub.Add(&timed, absl::Now() + absl::Milliseconds(200)).ok());
  EXPECT_EQ(hub.size(), 2);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(notified.done.HasBeenNotified());
  notified.ready = true;
  hub.NotifyAll();
  ASSERT_TRUE(notified.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_FALSE(notified.expired);
  ASSERT_TRUE(timed.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(timed.expired);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(hub.size(), 0);
}

TEST(WaitHubTest, WakePollsOneWaiterOnly) {
  WaitHub hub(0);
  FlagWaiter a, b;
  auto ida = hub.Add(&a, absl::InfiniteFuture());
  ASSERT_TRUE(ida.ok());
  ASSERT_TRUE(hub.Add(&b, absl::InfiniteFuture()).ok());
  absl::SleepFor(absl::Milliseconds(50));
  const int b_polls = b.polls.load();
  a.ready = true;
  hub.Wake(*ida);
  ASSERT_TRUE(a.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(b.polls.load(), b_polls);
  b.ready = true;
  hub.NotifyAll();
  ASSERT_TRUE(b.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST(WaitHubTest, CapRefusesWithTheFlag) {
  WaitHub hub(2);
  FlagWaiter a, b, c;
  ASSERT_TRUE(hub.Add(&a, absl::InfiniteFuture()).ok());
  ASSERT_TRUE(hub.Add(&b, absl::InfiniteFuture()).ok());
  auto refused = hub.Add(&c, absl::InfiniteFuture());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max_waiters"), std::string::npos);
  a.ready = b.ready = true;
  hub.NotifyAll();
  ASSERT_TRUE(a.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(b.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST(WaitHubTest, ChangeSignalRunsItsListener) {
  ChangeSignal signal;
  int calls = 0;
  signal.SetListener([&] { ++calls; });
  signal.SignalAll();
  signal.SignalAll();
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace wsync::controller
