#include "worker/agent/event_queue.h"

#include <utility>

namespace wsync::agent {

uint64_t EventQueue::Push(const v1::SyncEvent& e) {
  absl::MutexLock lock(&mu_);
  events_.push_back(e);
  return ++pushed_;
}

bool EventQueue::Pop(v1::SyncEvent* e, absl::Duration wait, bool read) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), wait)) return false;
  *e = std::move(events_.front());
  events_.pop_front();
  ++popped_;
  if (read) read_ = popped_;
  return true;
}

void EventQueue::MarkRead() {
  absl::MutexLock lock(&mu_);
  read_ = popped_;
}

void EventQueue::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool EventQueue::AwaitRead(uint64_t number, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto read = [this, number]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || read_ >= number; };
  return mu_.AwaitWithDeadline(absl::Condition(&read), deadline);
}

}  // namespace wsync::agent
