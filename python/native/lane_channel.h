// The trainer's side of the control fast lane in wsync._native.client
// (trainer_channel.cc): Sync and WaitSync over the controller's
// --lane_socket (common/lane_client.h) instead of gRPC, with the same
// request and response bytes and the same errors (RpcError(code, details)
// with the server's message). Other methods, a lane that is absent (a
// RuntimeWarning, then gRPC; tried again 10 s later) and a call while another
// one holds the lane go over gRPC.
#ifndef WSYNC_PYTHON_NATIVE_LANE_CHANNEL_H_
#define WSYNC_PYTHON_NATIVE_LANE_CHANNEL_H_

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/lane_client.h"

namespace wsync::python {

// Raises the module's RpcError((code, details)) (trainer_channel.cc).
[[noreturn]] void ThrowRpcError(int code, const std::string& details);

class LaneChannel {
 public:
  LaneChannel(std::string path, std::string token)
      : path_(std::move(path)), token_(std::move(token)) {}

  // The call's serialized response, or nullopt when the lane does not carry
  // it (the caller uses gRPC). `spin_s`: seconds of busy-waiting for the
  // answer first. Called with the GIL held; releases it while waiting.
  std::optional<pybind11::bytes> Call(const std::string& method, const std::string& request,
                                      double timeout_s, double spin_s);

 private:
  // Connected (with the lock held); false after a warning when absent.
  bool ConnectLocked();

  const std::string path_;
  const std::string token_;
  std::mutex mu_;
  std::unique_ptr<LaneClient> client_;
  absl::Time retry_after_ = absl::InfinitePast();
};

}  // namespace wsync::python

#endif  // WSYNC_PYTHON_NATIVE_LANE_CHANNEL_H_
