#include "python/native/lane_channel.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace py = pybind11;

namespace wsync::python {
namespace {

constexpr absl::Duration kRetryAfter = absl::Seconds(10);
constexpr absl::Duration kSignalCheck = absl::Milliseconds(100);
constexpr int kDeadlineExceeded = 4;
constexpr int kUnavailable = 14;

void Warn(const std::string& message) {
  PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1);  // an error here stays set
}

}  // namespace

bool LaneChannel::ConnectLocked() {
  if (client_ != nullptr && !client_->broken()) return true;
  client_.reset();
  if (absl::Now() < retry_after_) return false;
  absl::StatusOr<std::unique_ptr<LaneClient>> c = LaneClient::Connect(path_);
  if (!c.ok()) {
    retry_after_ = absl::Now() + kRetryAfter;
    Warn(absl::StrCat("wsync: control lane ", path_, ": ", c.status().message(),
                      "; calls go over gRPC (the lane is tried again in 10 s)"));
    return false;
  }
  client_ = *std::move(c);
  return true;
}

std::optional<py::bytes> LaneChannel::Call(const std::string& method, const std::string& request,
                                           double timeout_s, double spin_s) {
  const bool sync = absl::EndsWith(method, "/Sync");
  if (!sync && !absl::EndsWith(method, "/WaitSync")) return std::nullopt;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;  // another thread's call holds the lane
  v1::LaneRequest req;
  req.set_token(token_);
  const bool parsed = sync ? req.mutable_sync()->ParseFromString(request)
                           : req.mutable_wait_sync()->ParseFromString(request);
  if (!parsed) throw py::value_error(absl::StrCat("wsync: call ", method, ": bad request bytes"));
  const absl::Time now = absl::Now();
  const absl::Time deadline = now + absl::Seconds(timeout_s);
  const absl::Time spin_until = now + absl::Seconds(std::min(spin_s, timeout_s));
  absl::StatusOr<uint64_t> id;
  for (int attempt = 0; attempt < 2; ++attempt) {  // a connection the controller closed: again
    if (!ConnectLocked()) return std::nullopt;
    {
      py::gil_scoped_release nogil;
      id = client_->Send(req, deadline);
    }
    if (id.ok()) break;
  }
  if (!id.ok()) {
    Warn(absl::StrCat("wsync: control lane ", path_, ": ", id.status().message(),
                      "; this call goes over gRPC"));
    return std::nullopt;
  }
  while (true) {
    absl::StatusOr<std::optional<v1::LaneResponse>> got;
    {
      py::gil_scoped_release nogil;
      const absl::Time t = absl::Now();
      const bool spin = t < spin_until;
      got = client_->Receive(
          *id, std::min({deadline, t + kSignalCheck, spin ? spin_until : absl::InfiniteFuture()}),
          spin);
    }
    if (!got.ok() && client_->refused()) {
      // The controller refused the connection (over its limit): the call
      // never ran, as the pure-Python lane's refusal.
      client_.reset();
      retry_after_ = absl::Now() + kRetryAfter;
      Warn(absl::StrCat("wsync: control lane ", path_, ": ", got.status().message(),
                        "; calls go over gRPC (the lane is tried again in 10 s)"));
      return std::nullopt;
    }
    if (!got.ok()) ThrowRpcError(kUnavailable, std::string(got.status().message()));
    if (got->has_value()) {
      const v1::LaneResponse& resp = **got;
      if (resp.code() != 0 && resp.not_started()) {
        // The controller did not start the call (its lane's waits are full).
        Warn(absl::StrCat("wsync: control lane ", path_, ": ", resp.message(),
                          "; this call goes over gRPC"));
        return std::nullopt;
      }
      if (resp.code() != 0) ThrowRpcError(resp.code(), resp.message());
      return py::bytes(sync ? resp.sync().SerializeAsString()
                            : resp.wait_sync().SerializeAsString());
    }
    if (absl::Now() >= deadline) {
      client_.reset();  // its answer would come out of turn
      ThrowRpcError(kDeadlineExceeded, "Deadline Exceeded");
    }
    if (PyErr_CheckSignals() != 0) {
      client_.reset();  // as gRPC's cancel: the sync goes on, the wait ends
      throw py::error_already_set();
    }
  }
}

}  // namespace wsync::python
