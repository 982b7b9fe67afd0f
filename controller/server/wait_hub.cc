#include "controller/server/wait_hub.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::controller {

WaitHub::WaitHub(int64_t max_waiters, absl::Duration busy_poll)
    : max_waiters_(max_waiters), busy_(busy_poll) {
  thread_ = std::thread([this] { Run(); });
}

WaitHub::~WaitHub() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    SignalLocked();
  }
  thread_.join();
}

absl::StatusOr<uint64_t> WaitHub::Add(Waiter* waiter, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("controller is shutting down");
  if (max_waiters_ > 0 && static_cast<int64_t>(waiters_.size()) >= max_waiters_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the controller holds ", waiters_.size(),
        " waits and watchers (WaitSync, WatchSync, Sync wait_ms, KvGet, AwaitWriters), its "
        "limit (--max_waiters); retry later"));
  }
  const uint64_t id = next_id_++;
  waiters_[id] = Entry{waiter, deadline};
  deadlines_.emplace(deadline, id);
  woken_.insert(id);
  SignalLocked();
  return id;
}

void WaitHub::NotifyAll() {
  absl::MutexLock lock(&mu_);
  notify_all_ = true;
  SignalLocked();
}

void WaitHub::Wake(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (!waiters_.contains(id)) return;
  woken_.insert(id);
  SignalLocked();
}

void WaitHub::SignalLocked() {
  busy_.Touch();
  signalled_.store(true, std::memory_order_release);
}

int64_t WaitHub::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waiters_.size());
}

std::vector<WaitHub::Due> WaitHub::NextBatch() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || notify_all_ || !woken_.empty() ||
           (!deadlines_.empty() && deadlines_.begin()->first <= absl::Now());
  };
  while (!ready()) {
    const absl::Time next = deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
    // Bounded so that a deadline added meanwhile is never missed for long.
    const absl::Time slice = std::min(next, absl::Now() + absl::Milliseconds(100));
    if (!busy_.Spinning()) {
      mu_.AwaitWithDeadline(absl::Condition(&ready), slice);
      continue;
    }
    // Low-latency mode: poll the flag without the lock (signals go on).
    mu_.Unlock();
    while (!signalled_.load(std::memory_order_acquire) && busy_.Spinning() && absl::Now() < slice) {
      BusyPoll::Relax();
    }
    mu_.Lock();
  }
  signalled_.store(false, std::memory_order_relaxed);
  const absl::Time now = absl::Now();
  std::vector<Due> due;
  for (const auto& [id, e] : waiters_) {
    const bool expired = stop_ || e.deadline <= now;
    if (notify_all_ || expired || woken_.contains(id)) due.push_back({id, e.waiter, expired});
  }
  notify_all_ = false;
  woken_.clear();
  return due;
}

void WaitHub::Run() {
  while (true) {
    std::vector<Due> due = NextBatch();
    {
      absl::MutexLock lock(&mu_);
      if (stop_ && waiters_.empty()) return;
    }
    for (const Due& d : due) {
      if (!d.waiter->Poll(d.expired)) continue;
      absl::MutexLock lock(&mu_);
      auto it = waiters_.find(d.id);
      deadlines_.erase({it->second.deadline, d.id});
      waiters_.erase(it);
    }
  }
}

}  // namespace wsync::controller
