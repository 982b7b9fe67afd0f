#include "tools/sync_output.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"
#include "tools/subcommands.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::tools {
namespace {

// "512 B", "3.2 KB", "41.0 MB", "1.234 GB" (decimal units).
std::string Bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b < 1e3) return absl::StrCat(bytes, " B");
  if (b < 1e6) return absl::StrFormat("%.1f KB", b / 1e3);
  if (b < 1e9) return absl::StrFormat("%.1f MB", b / 1e6);
  return absl::StrFormat("%.3f GB", b / 1e9);
}

// GB/s with three significant digits (tiny test transfers are well below 1).
std::string GBps(double bytes_per_second) {
  return absl::StrFormat("%.3g GB/s", bytes_per_second / 1e9);
}

double Rate(const v1::SyncStatus& s) {
  return s.elapsed_seconds() > 0 ? static_cast<double>(s.bytes_done()) / s.elapsed_seconds() : 0;
}

}  // namespace

const char* PhaseName(v1::SyncPhase phase) {
  switch (phase) {
    case v1::SYNC_RUNNING:
      return "RUNNING";
    case v1::SYNC_SUCCEEDED:
      return "SUCCEEDED";
    case v1::SYNC_FAILED:
      return "FAILED";
    case v1::SYNC_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

std::string ProgressLine(const v1::SyncStatus& s, int bar_width) {
  const double fraction =
      s.bytes_total() > 0
          ? std::clamp(static_cast<double>(s.bytes_done()) / s.bytes_total(), 0.0, 1.0)
          : (s.phase() == v1::SYNC_SUCCEEDED ? 1.0 : 0.0);
  const int filled = static_cast<int>(fraction * bar_width);
  const double rate = Rate(s);
  std::string eta = "-";
  if (rate > 0 && s.phase() == v1::SYNC_RUNNING) {
    eta = absl::StrFormat("%.1fs", (s.bytes_total() - s.bytes_done()) / rate);
  } else if (s.phase() == v1::SYNC_SUCCEEDED) {
    eta = "0s";
  }
  return absl::StrFormat("%s v%d [%s%s] %3.0f%% %s / %s %s workers %d/%d ETA %s %s", s.transfer(),
                         s.version(), std::string(filled, '#'),
                         std::string(bar_width - filled, '.'), fraction * 100,
                         Bytes(s.bytes_done()), Bytes(s.bytes_total()), GBps(rate),
                         s.workers_done(), s.workers_total(), eta, PhaseName(s.phase()));
}

std::string OutcomeLine(const v1::SyncStatus& s) {
  std::string out = absl::StrFormat("sync %s of transfer '%s' version %d %s", s.sync_id(),
                                    s.transfer(), s.version(), PhaseName(s.phase()));
  if (s.phase() == v1::SYNC_SUCCEEDED || s.phase() == v1::SYNC_RUNNING) {
    absl::StrAppendFormat(&out, " after %.3f s: %s (%s), %d/%d workers", s.elapsed_seconds(),
                          Bytes(s.bytes_done()), GBps(Rate(s)), s.workers_done(),
                          s.workers_total());
    return out;
  }
  if (!s.failed_group().empty()) {
    absl::StrAppendFormat(&out, ": group %s rank %d (worker %d", s.failed_group(), s.failed_rank(),
                          s.failed_worker());
    if (s.failed_round() >= 0) absl::StrAppendFormat(&out, ", round %d", s.failed_round());
    if (s.failed_op() >= 0) absl::StrAppendFormat(&out, ", op %d", s.failed_op());
    out += ")";
  }
  absl::StrAppendFormat(&out, ": %s (code %d)", s.error().empty() ? "no error text" : s.error(),
                        s.error_code());
  return out;
}

int OutcomeExitCode(const v1::SyncStatus& s) {
  return s.phase() == v1::SYNC_SUCCEEDED ? kExitOk : kExitFailed;
}

int FollowSync(const Controller& controller, const std::string& sync_id, int64_t timeout_ms,
               bool live) {
  auto stub = v1::TrainerService::NewStub(controller.channel);
  grpc::ClientContext ctx;
  controller.Prepare(&ctx, timeout_ms);
  v1::WatchSyncRequest req;
  req.set_sync_id(sync_id);
  std::unique_ptr<grpc::ClientReader<v1::SyncStatus>> reader = stub->WatchSync(&ctx, req);
  v1::SyncStatus status;
  bool seen = false;
  while (reader->Read(&status)) {
    seen = true;
    const std::string line = ProgressLine(status);
    if (live) {
      std::fprintf(stdout, "\r%s\033[K", line.c_str());
    } else {
      std::fprintf(stdout, "%s\n", line.c_str());
    }
    std::fflush(stdout);
    if (status.phase() != v1::SYNC_RUNNING) {
      ctx.TryCancel();  // the end: the controller's stream need not be drained
      break;
    }
  }
  if (live && seen) std::fputc('\n', stdout);
  const grpc::Status finished = reader->Finish();
  if (!seen || status.phase() == v1::SYNC_RUNNING) {
    spdlog::error(
        "watch of sync '{}' on controller {}: {}", sync_id, controller.address,
        finished.ok() ? "the stream ended while the sync still runs" : DescribeRpcError(finished));
    return kExitFailed;
  }
  std::printf("%s\n", OutcomeLine(status).c_str());
  return OutcomeExitCode(status);
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, o).ok()) {
    return absl::InternalError(
        absl::StrCat("could not print a ", message.GetTypeName(), " as JSON"));
  }
  return json;
}

int PrintJson(const google::protobuf::Message& message, const std::string& command) {
  absl::StatusOr<std::string> text = ToJson(message);
  if (!text.ok()) {
    spdlog::error("{}: {}", command, std::string(text.status().message()));
    return kExitFailed;
  }
  std::fputs(text->c_str(), stdout);
  std::fputc('\n', stdout);
  return kExitOk;
}

absl::StatusOr<int64_t> ParseMillis(const std::string& text, const std::string& flag) {
  int64_t ms = 0;
  absl::Duration d;
  if (absl::SimpleAtoi(text, &ms)) {
    d = absl::Milliseconds(ms);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": expected a duration (250ms, 30s, 2m or milliseconds), got '", text, "'"));
  }
  if (d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": negative duration '", text, "'"));
  }
  return absl::ToInt64Milliseconds(d);
}

}  // namespace wsync::tools
