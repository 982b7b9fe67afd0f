// WaitHub: the controller's blocking waits and watchers (WaitSync, WatchSync,
// Sync with wait_ms, KvGet with timeout_ms, AwaitWriters) held without an OS
// thread each. A waiter registers here; the state owners' change signals
// (ChangeSignal below) and the waiter's own events (client gone, write done)
// make the hub's one thread poll it; it answers its RPC from there.
//
// The low-latency mode (--busy_poll_ms, common/busy_poll.h): for a window
// after the last signal, the hub's thread polls an atomic flag instead of
// sleeping on its condition variable, so that a sync's end reaches its
// waiting trainer without a thread wake-up.
//
// Locking: the hub's mutex is a leaf: Notify / Wake may be called while
// holding any owner's lock. Polls run on the hub's thread without it.
#ifndef WSYNC_CONTROLLER_SERVER_WAIT_HUB_H_
#define WSYNC_CONTROLLER_SERVER_WAIT_HUB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/busy_poll.h"

namespace wsync::controller {

class WaitHub {
 public:
  class Waiter {
   public:
    virtual ~Waiter() = default;
    // Runs on the hub's thread only, never twice at once for one waiter:
    // after it was added, after each NotifyAll, after Wake(its id) and once
    // its deadline passed (`expired`). Returns true once the waiter answered
    // its RPC: the hub then forgets it and never touches it again.
    virtual bool Poll(bool expired) = 0;
  };

  // `max_waiters`: how many may wait at once (--max_waiters; 0: no limit).
  // `busy_poll`: the thread's spin window (BusyPoll; zero: it sleeps).
  explicit WaitHub(int64_t max_waiters, absl::Duration busy_poll = absl::ZeroDuration());
  // Stops the thread; waiters still registered are polled as expired until
  // they answered.
  ~WaitHub();
  WaitHub(const WaitHub&) = delete;
  WaitHub& operator=(const WaitHub&) = delete;

  // Registers `waiter` (not owned: it must live until its Poll returned
  // true) and polls it soon. RESOURCE_EXHAUSTED at the cap: it was not
  // registered and must answer itself.
  absl::StatusOr<uint64_t> Add(Waiter* waiter, absl::Time deadline);
  // Every waiter is polled soon (the state it waits on may have changed).
  void NotifyAll();
  // Waiter `id` is polled soon; nothing once it answered.
  void Wake(uint64_t id);
  int64_t size() const;

 private:
  struct Entry {
    Waiter* waiter = nullptr;
    absl::Time deadline;
  };
  struct Due {
    uint64_t id;
    Waiter* waiter;
    bool expired;
  };
  void Run();
  // Waits for work and takes it.
  std::vector<Due> NextBatch();
  // Marks work for the thread (under mu_): the flag a spinning thread polls.
  void SignalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_waiters_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool notify_all_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> woken_ ABSL_GUARDED_BY(mu_);
  BusyPoll busy_;
  std::atomic<bool> signalled_{false};  // work came since the last batch
  std::thread thread_;
};

// A condition variable whose SignalAll also runs a listener (the hub's
// NotifyAll): the state owners signal their changes once, to the threads
// blocked in their own waits and to the hub's waiters.
class ChangeSignal {
 public:
  // Set before the owner is shared; the listener must not take the owner's lock.
  void SetListener(std::function<void()> listener) { listener_ = std::move(listener); }
  void SignalAll() {
    cv_.SignalAll();
    if (listener_) listener_();
  }
  // As absl::CondVar::WaitWithDeadline.
  bool WaitWithDeadline(absl::Mutex* mu, absl::Time deadline) {
    return cv_.WaitWithDeadline(mu, deadline);
  }

 private:
  absl::CondVar cv_;
  std::function<void()> listener_;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_WAIT_HUB_H_
