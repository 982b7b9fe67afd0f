// WaitHub: waiters polled on notifications, wakes and deadlines from one
// thread, and capped.
#include "controller/server/wait_hub.h"

#include <sys/resource.h>

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/runnable_threads.h"

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

// CPU seconds this process uses over the next `window` (getrusage).
double CpuOver(absl::Duration window) {
  auto now = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  const double before = now();
  absl::SleepFor(window);
  return now() - before;
}

TEST(WaitHubTest, ASpinningHubAnswersAtOnceAndStopsPromptly) {
  absl::Time destroyed_from;
  {
    WaitHub hub(0, /*busy_poll=*/absl::InfiniteDuration());
    FlagWaiter notified, timed;
    ASSERT_TRUE(hub.Add(&notified, absl::InfiniteFuture()).ok());
    ASSERT_TRUE(hub.Add(&timed, absl::Now() + absl::Milliseconds(200)).ok());
    // Strict: the hub's thread spins while nothing happens: it stays
    // runnable (the test's own thread is not counted).
    EXPECT_GT(testing::RunnableShares(getpid(), absl::Milliseconds(300))[0], 0.8);
    ASSERT_TRUE(timed.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_TRUE(timed.expired);  // deadlines still expire while it spins
    notified.ready = true;
    hub.NotifyAll();
    ASSERT_TRUE(notified.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_FALSE(notified.expired);
    destroyed_from = absl::Now();
  }
  EXPECT_LT(absl::Now() - destroyed_from, absl::Milliseconds(500));
}

TEST(WaitHubTest, TheSpinWindowEndsInSleep) {
  WaitHub hub(0, /*busy_poll=*/absl::Milliseconds(200));
  FlagWaiter w;
  ASSERT_TRUE(hub.Add(&w, absl::InfiniteFuture()).ok());  // activity: the window starts
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_LT(testing::RunnableShares(getpid())[0], 0.5) << "the hub still spins past its window";
  EXPECT_LT(CpuOver(absl::Seconds(1)), 0.05) << "the hub still uses CPU past its window";
  // A signal after the sleep is still answered, and restarts the window.
  w.ready = true;
  hub.NotifyAll();
  ASSERT_TRUE(w.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

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
