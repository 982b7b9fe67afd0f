// A client of the control fast lane (proto/wsync/v1/lane.proto; the
// controller's side is controller/server/lane_server.h): one Unix-socket
// connection, one call at a time. Used by the worker for its reports, by the
// Python package's native client for Sync / WaitSync, and by the benches.
//
// Thread-compatible: callers serialize their calls. After a transport
// failure (the peer closed, a deadline passed mid-call, a malformed frame)
// the connection is closed and every later call fails at once with
// UNAVAILABLE: connect again.
#ifndef WSYNC_COMMON_LANE_CLIENT_H_
#define WSYNC_COMMON_LANE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/lane_frame.h"
#include "wsync/v1/lane.pb.h"

namespace wsync {

class LaneClient {
 public:
  // UNAVAILABLE naming `path` when nothing listens there (or it is not a
  // socket); INVALID_ARGUMENT when the path is too long for a socket address.
  static absl::StatusOr<std::unique_ptr<LaneClient>> Connect(const std::string& path);
  ~LaneClient();
  LaneClient(const LaneClient&) = delete;
  LaneClient& operator=(const LaneClient&) = delete;

  // Sends `req` with a fresh call_id (returned), blocking until written or
  // `deadline` (DEADLINE_EXCEEDED; the connection is closed).
  absl::StatusOr<uint64_t> Send(v1::LaneRequest req, absl::Time deadline);
  // The response of call `call_id` once it came, nullopt when `until` passed
  // first (the call stays in flight: receive again). With `spin` the thread
  // polls the socket without sleeping (yielding its core between polls).
  // UNAVAILABLE when the connection ended or sent something else than that
  // response.
  absl::StatusOr<std::optional<v1::LaneResponse>> Receive(uint64_t call_id, absl::Time until,
                                                          bool spin);
  // Send, then Receive until `deadline` (DEADLINE_EXCEEDED then; the
  // connection is closed: the answer would come out of turn).
  absl::StatusOr<v1::LaneResponse> Call(v1::LaneRequest req, absl::Time deadline,
                                        bool spin = false);

  bool broken() const { return fd_ < 0; }
  // The controller refused this connection or one of its frames (it sent an
  // answer with call_id 0, then closed): the call in flight was not started
  // (earlier calls on the connection were answered in turn).
  bool refused() const { return refused_; }
  const std::string& path() const { return path_; }
  void Close();

 private:
  LaneClient(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // A whole frame in in_ parsed into *out; false while incomplete.
  absl::StatusOr<bool> TakeFrame(uint64_t call_id, v1::LaneResponse* out);
  absl::Status Broken(absl::Status status);

  int fd_;
  const std::string path_;
  uint64_t next_call_id_ = 1;
  std::string in_;
  bool refused_ = false;
};

// A transport-level status of the lane (as absl::Status) for a response's
// code and message.
absl::Status LaneResponseStatus(const v1::LaneResponse& resp);

}  // namespace wsync

#endif  // WSYNC_COMMON_LANE_CLIENT_H_
