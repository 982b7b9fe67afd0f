// One lease's assignment stream as a front end carries it: the gRPC
// reactor (assignment_stream.h) and the control fast lane's stream
// connection (lane_server.h) both open it, ask it what to send next and
// close it when their transport ends, so the two streams follow one set of
// rules (WorkerRegistry::OpenStream / NextAssignment / CloseStream):
//  - Next: an assignment to send, nothing yet (wait for the wake), or the
//    stream's end with the registry's reason (the lease died, a newer
//    stream replaced it, the controller is shutting down). After the end
//    the feed is over; the registry ended it, so nothing is closed.
//  - Close: the front end's transport ended (the worker went away, a write
//    failed): the lease ends, as a worker that lost its stream must
//    register again. A no-op once over.
//
// Next and Close may run on different threads (the reactor's); Close must
// run holding no controller lock (the registry's loss listener takes the
// coordinator's).
#ifndef WSYNC_CONTROLLER_SERVER_ASSIGNMENT_FEED_H_
#define WSYNC_CONTROLLER_SERVER_ASSIGNMENT_FEED_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "controller/server/worker_registry.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

class AssignmentFeed {
 public:
  // `workers` outlives the feed.
  AssignmentFeed(WorkerRegistry* workers, std::string lease_id)
      : workers_(workers), lease_id_(std::move(lease_id)) {}
  AssignmentFeed(const AssignmentFeed&) = delete;
  AssignmentFeed& operator=(const AssignmentFeed&) = delete;

  // Opens the lease's stream; `wake` (any thread, also after the end) is
  // called whenever Next may have something new. The registry's error (a
  // dead lease) otherwise.
  absl::Status Open(std::function<void()> wake);

  enum class Step { kNothing, kAssignment, kEnd };
  // What to send next: kAssignment fills *out; kEnd sets *end (not OK) and
  // ends the feed; kNothing: nothing yet, or the feed is not open.
  Step Next(v1::Assignment* out, absl::Status* end);

  // The front end's transport ended: ends the lease (WorkerRegistry::
  // CloseStream) with `why`; no-op when not open.
  void Close(const std::string& why);

  bool open() const { return token_.load() != 0; }
  const std::string& lease_id() const { return lease_id_; }

 private:
  WorkerRegistry* const workers_;
  const std::string lease_id_;
  std::atomic<uint64_t> token_{0};  // 0: not open, ended or closed
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_ASSIGNMENT_FEED_H_
