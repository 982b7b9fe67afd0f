// `wsyncctl replicas`: what each replica of a destination group serves, as
// the controller aggregates its owners' reports (TrainerService.Replicas;
// docs/api.md, "Serving versions"). With --version V: the labels of the
// replicas serving V, one a line (exit 1 when none does).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/serving_state.h"
#include "controller/server/serving_board.h"
#include "grpcpp/grpcpp.h"
#include "tools/cli.h"
#include "tools/controller_channel.h"
#include "tools/subcommands.h"
#include "tools/sync_output.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::tools {
namespace {

std::string Label(const std::string& replica) { return replica.empty() ? "(unlabelled)" : replica; }

void PrintTable(const v1::ReplicasResponse& r) {
  std::printf("group %s: %d ranks, %d replicas\n", r.group().c_str(), r.group_size(),
              r.replicas_size());
  for (const v1::ReplicaServing& rep : r.replicas()) {
    std::printf("replica %-14s %-10s version %-8lld ranks %d/%d  last synced %lld\n",
                Label(rep.replica()).c_str(), controller::ReplicaStateName(rep.state()),
                static_cast<long long>(rep.version()), rep.ranks_size(), rep.expected_ranks(),
                static_cast<long long>(rep.last_synced_version()));
    for (const v1::RankServing& rank : rep.ranks()) {
      const std::string age =
          rank.ms_since_report() < 0 ? "never" : absl::StrCat(rank.ms_since_report(), " ms ago");
      const char* liveness = !rank.live() ? "lost" : rank.reported() ? "live" : "silent";
      std::printf("  rank %-4d %-9s version %-8lld synced %-8lld %-6s reported %s\n", rank.rank(),
                  rank.reported() ? ServingStateName(rank.state()) : "-",
                  static_cast<long long>(rank.version()),
                  static_cast<long long>(rank.last_synced_version()), liveness, age.c_str());
    }
  }
}

}  // namespace

int RunReplicasCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "What each replica of a destination group serves, as the controller aggregates its "
      "owners' reports: state, version, and each rank's version, state, last synced version "
      "and report age. Needs a token (--token / --token_file) of role reader or above on a "
      "controller with --tokens_file.",
      "replicas");
  ChannelOptions options;
  AddChannelOptions(app, &options, 10000);
  std::string group = "inference";
  int64_t version = -1;
  bool json = false;
  app.add_option("--group", group, "the destination group")->capture_default_str()->type_name("G");
  app.add_option("--version", version,
                 "print only the labels of the replicas serving V, one a line (exit 1 when "
                 "none does)")
      ->type_name("V");
  app.add_flag("--json", json, "the ReplicasResponse as JSON (proto field names)");
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  v1::ReplicasRequest req;
  req.set_group(group);
  v1::ReplicasResponse resp;
  const grpc::Status s =
      controller->CallTrainer(&v1::TrainerService::Stub::Replicas, req, &resp, options.timeout_ms);
  if (!s.ok()) {
    spdlog::error("replicas of group '{}' from controller {}: {}", group, options.controller,
                  DescribeRpcError(s));
    return kExitFailed;
  }
  if (version >= 0) {
    std::vector<std::string> at;
    for (const v1::ReplicaServing& rep : resp.replicas()) {
      if (rep.state() == v1::REPLICA_SERVING && rep.version() == version) {
        at.push_back(rep.replica());
      }
    }
    for (const std::string& label : at) std::printf("%s\n", Label(label).c_str());
    return at.empty() ? kExitFailed : kExitOk;
  }
  if (json) return PrintJson(resp, "replicas of group '" + group + "'");
  PrintTable(resp);
  return kExitOk;
}

}  // namespace wsync::tools
