// The queue of sync events for one local subscriber of a worker (the
// owner's SyncEvents stream, or an embedded owner's events()).
#ifndef WSYNC_WORKER_AGENT_EVENT_QUEUE_H_
#define WSYNC_WORKER_AGENT_EVENT_QUEUE_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

// Events for one local subscriber (SyncEvents stream). Numbered as pushed
// (1, 2, ...): the publisher may wait until the subscriber read an event
// (AwaitRead), so that a staged report never precedes its owner's STAGED.
class EventQueue {
 public:
  // `who` names the subscriber in errors (e.g. "owner #2: SyncEvents stream
  // from unix:/run/wsync.sock, subscribed at ...").
  explicit EventQueue(std::string who = "") : who_(std::move(who)) {}
  const std::string& who() const { return who_; }
  // Returns the event's number.
  uint64_t Push(const v1::SyncEvent& e);
  // Waits up to `wait`; false when nothing arrived. With `read`, the event
  // counts as read by the subscriber now (an in-process reader); else once
  // MarkRead is called (a stream: after its write).
  bool Pop(v1::SyncEvent* e, absl::Duration wait, bool read = true);
  // The last event popped was delivered to the subscriber.
  void MarkRead();
  // The subscriber is gone (Unsubscribe): no wait blocks on it any more.
  void Close();
  // Blocks until event `number` was read (or the queue closed), at most
  // until `deadline`; false if not read by then.
  bool AwaitRead(uint64_t number, absl::Time deadline);

 private:
  const std::string who_;
  absl::Mutex mu_;
  std::deque<v1::SyncEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t popped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t read_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_EVENT_QUEUE_H_
