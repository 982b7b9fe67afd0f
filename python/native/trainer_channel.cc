// wsync._native.client: unary calls of the controller's TrainerService made
// by gRPC's C++ library (BindClient, called by module.cc). wsync.Client sends
// its unary calls through it when the extension is built (the trainer's hot
// path, Sync with wait_ms, is one such call): requests and responses cross
// as serialized protobuf bytes, the GIL is released for the whole call and
// the calling thread itself waits on the call's completion queue, so a
// response wakes it directly (no Python-side call objects, no hand-off).
// Optionally it busy-waits for the answer (Call's `spin`): on virtual
// machines a sleeping thread's wake-up after a quiet spell costs a few
// hundred microseconds (docs/performance-notes.md, "The control path").
//
// A failed call raises wsync._native.client.RpcError with args
// (code: int, details: str); wsync.errors turns it into the matching
// WsyncError, as it does for grpc.RpcError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "python/native/lane_channel.h"

namespace py = pybind11;

namespace wsync::python {
namespace {

struct RpcError {
  int code;
  std::string details;
};

// wsync._native.client.RpcError, created once by BindClient.
PyObject*& RpcErrorType() {
  static PyObject* type = nullptr;
  return type;
}

// TLS settings as wsync.Tls holds them, read into PEM text by the caller;
// no TLS at all when `tls` is false.
struct ChannelConfig {
  std::string address;
  bool tls = false;
  std::string root_pem, key_pem, cert_pem;
  std::string token;  // bearer token; empty: none
  std::string lane;   // the controller's control fast lane; empty: none
  std::vector<std::pair<std::string, py::object>> options;
};

grpc::ChannelArguments ArgumentsOf(const ChannelConfig& c) {
  grpc::ChannelArguments args;
  for (const auto& [key, value] : c.options) {
    if (py::isinstance<py::bool_>(value) || py::isinstance<py::int_>(value)) {
      args.SetInt(key, py::cast<int>(value));
    } else if (py::isinstance<py::str>(value)) {
      args.SetString(key, py::cast<std::string>(value));
    } else {
      throw py::type_error(absl::StrCat("wsync: channel option '", key,
                                        "' must be an int or a str, not ",
                                        py::str(value.get_type()).cast<std::string>()));
    }
  }
  return args;
}

std::shared_ptr<grpc::ChannelCredentials> CredentialsOf(const ChannelConfig& c) {
  if (!c.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = c.root_pem;  // empty: the system roots
  ssl.pem_private_key = c.key_pem;
  ssl.pem_cert_chain = c.cert_pem;
  return grpc::SslCredentials(ssl);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Seconds as a duration; checked finite and non-negative by the caller;
// past a year they mean "no limit".
std::chrono::microseconds After(double seconds) {
  constexpr double kYear = 365.0 * 24 * 3600;
  return std::chrono::microseconds(static_cast<int64_t>(std::min(seconds, kYear) * 1e6));
}

// One unary call in flight on a completion queue of its own.
class PendingCall {
 public:
  PendingCall(grpc::GenericStub& stub, const std::string& token, const std::string& method,
              const std::string& request, std::chrono::system_clock::time_point deadline) {
    ctx_.set_deadline(deadline);
    if (!token.empty()) ctx_.AddMetadata("authorization", "Bearer " + token);
    grpc::Slice slice(request);
    const grpc::ByteBuffer in(&slice, 1);
    call_ = stub.PrepareUnaryCall(&ctx_, method, in, &cq_);
    call_->StartCall();
    call_->Finish(&out_, &status_, /*tag=*/&status_);
  }
  ~PendingCall() {
    if (!done_) {  // only when an exception skipped the wait: end it first
      ctx_.TryCancel();
      WaitUntil(std::chrono::system_clock::time_point::max());
    }
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;

  // Polls without sleeping until the call ended or `until`; true if it ended.
  bool SpinUntil(std::chrono::system_clock::time_point until) {
    // A deadline long past: gRPC rounds deadlines up to the next millisecond,
    // so polling with "now" napped up to 1 ms in the poller each call.
    while (!done_ && std::chrono::system_clock::now() < until)
      Poll(std::chrono::system_clock::time_point());
    return done_;
  }
  // Sleeps until the call ended or `until`; true if it ended.
  bool WaitUntil(std::chrono::system_clock::time_point until) {
    if (!done_) Poll(until);
    return done_;
  }
  void Cancel() { ctx_.TryCancel(); }
  const grpc::Status& status() const { return status_; }
  std::string Response() const { return Flatten(out_); }

 private:
  void Poll(std::chrono::system_clock::time_point until) {
    void* tag = nullptr;
    bool ok = false;
    done_ = cq_.AsyncNext(&tag, &ok, until) == grpc::CompletionQueue::GOT_EVENT;
  }

  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  grpc::ByteBuffer out_;
  grpc::Status status_;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call_;
  bool done_ = false;
};

class TrainerChannel {
 public:
  explicit TrainerChannel(ChannelConfig config)
      : token_(std::move(config.token)),
        lane_(config.lane.empty() ? nullptr : std::make_unique<LaneChannel>(config.lane, token_)),
        channel_(grpc::CreateCustomChannel(config.address, CredentialsOf(config),
                                           ArgumentsOf(config))) {}

  // One unary call of `method` ("/wsync.v1.TrainerService/Sync"), bounded by
  // `timeout_s`; the serialized response, or RpcError. For its first
  // `spin_s` seconds the calling thread polls the call's completion queue
  // without sleeping (a busy wait: one core, and no wake-up to pay when
  // the answer comes), then it sleeps until the answer or the deadline.
  // Every 100 ms, spinning or sleeping, it takes the GIL to let Python
  // handle signals: Ctrl-C cancels the call and raises KeyboardInterrupt.
  py::bytes Call(const std::string& method, const std::string& request, double timeout_s,
                 double spin_s) {
    CheckSeconds(method, "timeout", timeout_s, /*zero_ok=*/false);
    CheckSeconds(method, "spin", spin_s, /*zero_ok=*/true);
    if (lane_ != nullptr) {
      if (std::optional<py::bytes> out = lane_->Call(method, request, timeout_s, spin_s)) {
        return *std::move(out);
      }
      if (PyErr_Occurred() != nullptr) throw py::error_already_set();  // a warning made an error
    }
    const auto now = std::chrono::system_clock::now();
    const auto deadline = now + After(timeout_s);
    const auto spin_until = now + After(std::min(spin_s, timeout_s));
    PendingCall call(stub_, token_, method, request, deadline);
    bool done = false;
    while (!done) {
      {
        py::gil_scoped_release nogil;
        const auto now = std::chrono::system_clock::now();
        const auto slice_end = now + kSignalCheck;
        done = now < spin_until ? call.SpinUntil(std::min(spin_until, slice_end))
                                : call.WaitUntil(slice_end);
      }
      if (!done && PyErr_CheckSignals() != 0) {
        call.Cancel();
        {
          py::gil_scoped_release nogil;
          call.WaitUntil(std::chrono::system_clock::time_point::max());
        }
        throw py::error_already_set();  // the signal handler's exception
      }
    }
    if (!call.status().ok()) {
      PyErr_SetObject(RpcErrorType(), py::make_tuple(static_cast<int>(call.status().error_code()),
                                                     call.status().error_message())
                                          .ptr());
      throw py::error_already_set();
    }
    return py::bytes(call.Response());
  }

 private:
  static constexpr std::chrono::milliseconds kSignalCheck{100};

  static void CheckSeconds(const std::string& method, const char* what, double seconds,
                           bool zero_ok) {
    if (std::isfinite(seconds) && (seconds > 0 || (zero_ok && seconds == 0))) return;
    throw py::value_error(absl::StrCat("wsync: call ", method, ": ", what, " must be a ",
                                       zero_ok ? "non-negative" : "positive",
                                       " number of seconds, got ", seconds));
  }

  const std::string token_;
  const std::unique_ptr<LaneChannel> lane_;  // null: no lane
  const std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_{channel_};
};

}  // namespace

void ThrowRpcError(int code, const std::string& details) {
  PyErr_SetObject(RpcErrorType(), py::make_tuple(code, details).ptr());
  throw py::error_already_set();
}

void BindClient(py::module_& m) {
  static py::exception<RpcError> rpc_error(m, "RpcError");
  RpcErrorType() = rpc_error.ptr();
  py::class_<TrainerChannel>(m, "TrainerChannel")
      .def(py::init([](std::string address, bool tls, py::bytes root_pem, py::bytes key_pem,
                       py::bytes cert_pem, std::string token,
                       std::vector<std::pair<std::string, py::object>> options, std::string lane) {
             return std::make_unique<TrainerChannel>(
                 ChannelConfig{std::move(address), tls, root_pem, key_pem, cert_pem,
                               std::move(token), std::move(lane), std::move(options)});
           }),
           py::arg("address"), py::arg("tls") = false, py::arg("root_pem") = py::bytes(),
           py::arg("key_pem") = py::bytes(), py::arg("cert_pem") = py::bytes(),
           py::arg("token") = "", py::arg("options") = py::list(), py::arg("lane") = "")
      .def("call", &TrainerChannel::Call, py::arg("method"), py::arg("request"), py::arg("timeout"),
           py::arg("spin") = 0.0,
           "One unary call; the serialized response. Raises RpcError((code, details)). "
           "`spin`: seconds of busy-waiting for the answer before sleeping.");
}

}  // namespace wsync::python
