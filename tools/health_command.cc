// `wsyncctl health`: asks the controller's standard gRPC health service
// (grpc.health.v1.Health/Check) whether it serves. The container image's
// HEALTHCHECK, the chart's TLS liveness / readiness probes and its `helm test`
// hook run it. Exit 0 when SERVING; 1 when the controller answers another
// status or cannot be reached within --timeout_ms; 2 on bad usage.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "tools/cli.h"
#include "tools/controller_channel.h"
#include "tools/subcommands.h"

namespace wsync::tools {
namespace {

// grpc.health.v1 messages (health.proto, field numbers of the standard):
// HealthCheckRequest{string service = 1}; HealthCheckResponse{ServingStatus
// status = 1}, UNKNOWN 0, SERVING 1, NOT_SERVING 2, SERVICE_UNKNOWN 3.
constexpr uint32_t kServiceTag = (1 << 3) | 2;  // field 1, length-delimited
constexpr uint32_t kStatusTag = (1 << 3) | 0;   // field 1, varint

std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;  // proto3: the default is not written
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteTag(kServiceTag);
  coded.WriteVarint32(static_cast<uint32_t>(service.size()));
  coded.WriteString(service);
  return out;
}

absl::StatusOr<uint32_t> DecodeStatus(const std::string& bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  uint32_t status = 0;
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == kStatusTag) {
      if (!in.ReadVarint32(&status)) break;
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) {
      return absl::DataLossError("undecodable grpc.health.v1.HealthCheckResponse");
    }
  }
  return status;
}

const char* StatusName(uint32_t status) {
  switch (status) {
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

// One Health/Check call; the decoded status, or the call's error.
absl::StatusOr<uint32_t> Check(const Controller& controller, const std::string& service,
                               int64_t timeout_ms) {
  grpc::GenericStub stub(controller.channel);
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  controller.Prepare(&ctx, timeout_ms);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_all();
                 });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("grpc.health.v1.Health/Check: ", status.error_message(), " (code ",
                     static_cast<int>(status.error_code()), ")"));
  }
  grpc::Slice body;
  if (!response.DumpToSingleSlice(&body).ok()) {
    return absl::DataLossError("unreadable grpc.health.v1.HealthCheckResponse");
  }
  return DecodeStatus(std::string(reinterpret_cast<const char*>(body.begin()), body.size()));
}

}  // namespace

int RunHealthCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "grpc.health.v1.Health/Check of the controller; prints the status. Exit 0 when SERVING, "
      "1 otherwise or when it cannot be reached within --timeout_ms, 2 on bad usage.",
      "health");
  ChannelOptions options;
  AddChannelOptions(app, &options, 3000);
  std::string service;
  app.add_option("--service", service, "a service name (default \"\": the whole server)");
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  absl::StatusOr<uint32_t> status = Check(*controller, service, options.timeout_ms);
  if (!status.ok()) {
    spdlog::error("health of controller {}: {}", options.controller,
                  std::string(status.status().message()));
    return kExitFailed;
  }
  std::printf("%s\n", StatusName(*status));
  return *status == 1 ? kExitOk : kExitFailed;
}

}  // namespace wsync::tools
