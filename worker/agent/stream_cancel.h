// Cancels the worker's lane assignment stream (agent_lane.cc) by lease
// epoch, so that no cancel is lost: a cancel names the epoch whose stream
// it ends (and every earlier one), and the stream of epoch e is cancelled
// once a cancel of e or later came, whenever it came: before the reader
// started (the heartbeat learnt the lease was forgotten while the session
// was still connecting the lane) or while it reads. Nothing ever resets it,
// unlike a flag the reader cleared when it started (which erased a cancel
// that came first).
//
// Thread-safe (lock-free).
#ifndef WSYNC_WORKER_AGENT_STREAM_CANCEL_H_
#define WSYNC_WORKER_AGENT_STREAM_CANCEL_H_

#include <atomic>
#include <cstdint>
#include <limits>

namespace wsync::agent {

class StreamCancel {
 public:
  // Ends the streams of `epoch` and every earlier epoch.
  void Cancel(uint64_t epoch) {
    uint64_t seen = epoch_.load();
    while (seen < epoch && !epoch_.compare_exchange_weak(seen, epoch)) {
    }
  }
  // Ends every stream, present and future (the worker stops).
  void CancelAll() { epoch_.store(std::numeric_limits<uint64_t>::max()); }
  bool Cancelled(uint64_t epoch) const { return epoch_.load() >= epoch; }

 private:
  std::atomic<uint64_t> epoch_{0};  // epochs start at 1
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_STREAM_CANCEL_H_
