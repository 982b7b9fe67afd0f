// `wsyncctl sync`, `watch` and `cancel`: start a sync of a transfer, follow
// one to its end, cancel one (TrainerService.Sync / WatchSync / Cancel;
// docs/operations.md, "wsyncctl for operators"). Exit 0 when the sync succeeded (or the
// cancel was accepted), 1 when it failed, was cancelled or the controller
// refused, 2 on bad usage. `sync --lane` sends its Sync over the
// controller's control fast lane (common/lane_client.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "common/logging.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tools/cli.h"
#include "tools/controller_channel.h"
#include "tools/subcommands.h"
#include "tools/sync_output.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::tools {
namespace {

constexpr char kWaitUntilEnd[] = "end";

// Prints the SyncStatus as JSON with "round_trip_ms" added; false (logged)
// when it cannot be printed.
bool PrintStatusJson(const v1::SyncStatus& status, double round_trip_ms) {
  absl::StatusOr<std::string> json = ToJson(status);
  google::protobuf::Struct object;
  if (!json.ok() || !google::protobuf::util::JsonStringToMessage(*json, &object).ok()) {
    spdlog::error("sync: could not print the status of sync '{}' as JSON", status.sync_id());
    return false;
  }
  (*object.mutable_fields())["round_trip_ms"].set_number_value(round_trip_ms);
  return PrintJson(object, "sync") == kExitOk;
}

// Why the lane did not carry a Sync, when it certainly did not start it
// (the caller may send it over gRPC then): the lane is absent, refuses
// connections or is not trusted; the controller refused the connection (over
// its limit, not its user: an answer of call_id 0, LaneClient::refused()); the
// request could not be written; or the controller answered that it did not
// start the call (LaneResponse.not_started: its waits are full).
struct NotCarried {
  std::string why;
};

// Sync over the control fast lane at `path`: the call's status (the
// response in *resp), or NotCarried (see above). Once the request is
// written, any other outcome stands (a lost connection is UNAVAILABLE: the
// sync may have started).
std::variant<grpc::Status, NotCarried> LaneSync(const std::string& path, const std::string& token,
                                                const v1::SyncRequest& req, int64_t timeout_ms,
                                                v1::SyncResponse* resp) {
  absl::StatusOr<std::unique_ptr<LaneClient>> lane = LaneClient::Connect(path);
  if (!lane.ok()) return NotCarried{std::string(lane.status().message())};
  v1::LaneRequest lane_req;
  lane_req.set_token(token);
  *lane_req.mutable_sync() = req;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  absl::StatusOr<uint64_t> id = (*lane)->Send(std::move(lane_req), deadline);
  if (!id.ok()) return NotCarried{std::string(id.status().message())};
  absl::StatusOr<std::optional<v1::LaneResponse>> got =
      (*lane)->Receive(*id, deadline, /*spin=*/false);
  if (!got.ok()) {
    if ((*lane)->refused()) {
      return NotCarried{std::string(got.status().message())};
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(got.status().message()));
  }
  if (!got->has_value())
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
  const v1::LaneResponse& answer = **got;
  if (answer.code() != 0 && answer.not_started()) {
    return NotCarried{absl::StrCat("lane ", path, ": ", answer.message())};
  }
  if (answer.code() != 0) {
    const int code = answer.code() > 0 && answer.code() <= 16 ? answer.code() : 2;  // UNKNOWN
    return grpc::Status(static_cast<grpc::StatusCode>(code), answer.message());
  }
  *resp = answer.sync();
  return grpc::Status::OK;
}

}  // namespace

int RunSyncCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "Starts a sync of TRANSFER to VERSION (TrainerService.Sync; needs role trainer) and "
      "prints its id. --wait answers in one round trip once the sync ended (wait_ms), printing "
      "the outcome and the round-trip time measured around the RPC; --watch follows it with a "
      "progress line. Exit 0 on SUCCEEDED (or when started without --wait / --watch), 1 "
      "otherwise.",
      "sync");
  ChannelOptions options;
  AddChannelOptions(app, &options, 10000);
  std::string transfer, deadline, wait;
  int64_t version = 0;
  bool resend = false, watch = false, json = false;
  app.add_option("TRANSFER", transfer, "the transfer's name")->required();
  app.add_option("VERSION", version, "the weights' version (above the last delivered one)")
      ->required();
  app.add_option("--deadline", deadline,
                 "the sync's deadline (250ms, 30s, 2m or ms; default: the controller's "
                 "--sync_deadline)")
      ->type_name("D");
  app.add_flag("--resend", resend, "accept VERSION equal to the last delivered version");
  CLI::Option* wait_flag = app.add_flag(
      std::string("--wait{") + kWaitUntilEnd + "}", wait,
      "answer once the sync ended; --wait=D: at most D (default: until it ends, bounded by "
      "its deadline and the controller's --max_wait)");
  app.add_flag("--watch", watch, "follow the sync with a progress line until it ends");
  app.add_flag("--json", json, "print the SyncStatus as JSON plus round_trip_ms");
  std::string lane;
  bool lane_required = false;
  app.add_option("--lane", lane,
                 "the controller's control fast lane (its --lane_socket, on this host, as its "
                 "user): Sync goes over that Unix socket with the same token and answer; absent, "
                 "refused (over its connection or wait limit) or not trusted: one warning, then "
                 "gRPC (docs/performance-notes.md)")
      ->envname("WSYNC_CONTROLLER_LANE")
      ->type_name("PATH");
  app.add_flag("--lane-required", lane_required,
               "with --lane: fail (exit 1) where the lane does not carry the Sync, instead of "
               "sending it over gRPC");
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  v1::SyncRequest req;
  req.set_transfer(transfer);
  req.set_version(version);
  req.set_resend(resend);
  if (!deadline.empty()) {
    absl::StatusOr<int64_t> ms = ParseMillis(deadline, "--deadline");
    if (!ms.ok()) return UsageError(app, std::string(ms.status().message()));
    req.set_deadline_ms(*ms);
  }
  const bool waiting = wait_flag->count() > 0;
  if (waiting && watch) return UsageError(app, "--wait and --watch: give one of them");
  if (lane_required && lane.empty()) return UsageError(app, "--lane-required needs --lane PATH");
  int64_t call_timeout_ms = options.timeout_ms;
  if (waiting) {
    int64_t wait_ms = 0;
    if (wait != kWaitUntilEnd) {
      absl::StatusOr<int64_t> ms = ParseMillis(wait, "--wait");
      if (!ms.ok()) return UsageError(app, std::string(ms.status().message()));
      wait_ms = *ms;
    } else {
      // Until the end: the sync's deadline (or a day) bounds the server's wait.
      wait_ms = req.deadline_ms() > 0 ? req.deadline_ms() : 24 * 3600 * 1000LL;
    }
    if (wait_ms <= 0) return UsageError(app, "--wait: give a positive duration");
    req.set_wait_ms(wait_ms);
    call_timeout_ms = wait_ms + options.timeout_ms;
  }
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  v1::SyncResponse resp;
  const auto start = std::chrono::steady_clock::now();
  std::optional<grpc::Status> over_lane;
  if (!lane.empty()) {
    std::variant<grpc::Status, NotCarried> sent =
        LaneSync(lane, controller->token, req, call_timeout_ms, &resp);
    if (const NotCarried* no = std::get_if<NotCarried>(&sent); no != nullptr) {
      if (lane_required) {
        spdlog::error(
            "sync of transfer '{}' to version {}: control lane {}: {} (not started; "
            "--lane-required)",
            transfer, version, lane, no->why);
        return kExitFailed;
      }
      spdlog::warn("sync: control lane {}: {}; the call goes over gRPC", lane, no->why);
    } else {
      over_lane = std::get<grpc::Status>(std::move(sent));
    }
  }
  const grpc::Status s =
      over_lane.has_value()
          ? *over_lane
          : controller->CallTrainer(&v1::TrainerService::Stub::Sync, req, &resp, call_timeout_ms);
  const double round_trip_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!s.ok()) {
    spdlog::error("sync of transfer '{}' to version {} on controller {}{}: {}", transfer, version,
                  options.controller, over_lane.has_value() ? " (over the lane)" : "",
                  DescribeRpcError(s));
    return kExitFailed;
  }
  if (watch) {
    std::printf("sync %s started (plan %s%s)\n", resp.sync_id().c_str(), resp.plan_key().c_str(),
                resp.plan_cache_hit() ? ", cached" : "");
    std::fflush(stdout);
    return FollowSync(*controller, resp.sync_id(), 0, isatty(STDOUT_FILENO) != 0);
  }
  if (json) {
    v1::SyncStatus status = resp.status();
    if (status.sync_id().empty()) status.set_sync_id(resp.sync_id());
    if (!PrintStatusJson(status, round_trip_ms)) return kExitFailed;
    return waiting ? OutcomeExitCode(status) : kExitOk;
  }
  if (!waiting) {
    std::printf("%s\n", resp.sync_id().c_str());
    return kExitOk;
  }
  std::printf("%s\nround trip %.3f ms (plan %s%s)\n", OutcomeLine(resp.status()).c_str(),
              round_trip_ms, resp.plan_key().c_str(), resp.plan_cache_hit() ? ", cached" : "");
  return OutcomeExitCode(resp.status());
}

int RunWatchCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "Follows sync SYNC_ID to its end (TrainerService.WatchSync; role reader): on a terminal "
      "one live line (bar, bytes, GB/s, workers done, ETA), plain lines otherwise, then the "
      "outcome. Exit 0 on SUCCEEDED, 1 on FAILED / CANCELLED (naming the failed group, rank "
      "and error).",
      "watch");
  ChannelOptions options;
  AddChannelOptions(app, &options, 0);
  std::string sync_id;
  app.add_option("SYNC_ID", sync_id, "the id `wsyncctl sync` printed")->required();
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  return FollowSync(*controller, sync_id, options.timeout_ms, isatty(STDOUT_FILENO) != 0);
}

int RunCancelCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "Cancels sync SYNC_ID (TrainerService.Cancel; role trainer owning its transfer, "
      "or admin) and prints its status. Exit 0 when it ends CANCELLED, 1 otherwise.",
      "cancel");
  ChannelOptions options;
  AddChannelOptions(app, &options, 10000);
  std::string sync_id, reason = "wsyncctl cancel";
  bool json = false;
  app.add_option("SYNC_ID", sync_id, "the sync to cancel")->required();
  app.add_option("--reason", reason, "recorded with the cancellation")->capture_default_str();
  app.add_flag("--json", json, "print the SyncStatus as JSON");
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  v1::CancelRequest req;
  req.set_sync_id(sync_id);
  req.set_reason(reason);
  v1::SyncStatus status;
  const grpc::Status s =
      controller->CallTrainer(&v1::TrainerService::Stub::Cancel, req, &status, options.timeout_ms);
  if (!s.ok()) {
    spdlog::error("cancel of sync '{}' on controller {}: {}", sync_id, options.controller,
                  DescribeRpcError(s));
    return kExitFailed;
  }
  if (json) {
    if (PrintJson(status, "cancel") != kExitOk) return kExitFailed;
  } else {
    std::printf("%s\n", OutcomeLine(status).c_str());
  }
  return status.phase() == v1::SYNC_CANCELLED ? kExitOk : kExitFailed;
}

}  // namespace wsync::tools
