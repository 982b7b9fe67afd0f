// `wsyncctl replicas`: what each replica of a destination group serves, as
// the controller aggregates its owners' reports (TrainerService.Replicas;
// docs/api.md, "Serving versions"). With --version V: the labels of the
// replicas serving V, one a line (exit 1 when none does).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/serving_state.h"
#include "controller/server/serving_board.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "tools/args.h"
#include "tools/controller_channel.h"
#include "tools/subcommands.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::tools {
namespace {

void ReplicasUsage(FILE* out) {
  std::fprintf(out,
               "usage: wsyncctl replicas --controller HOST:PORT [--group G] [--version V] "
               "[--json] [--timeout_ms MS]\n"
               "         [--controller_ca PEM [--cert PEM --key PEM]] [--token_file FILE]\n"
               "  TLS when --controller_ca names the CA of the controller's certificate "
               "(plaintext otherwise,\n"
               "  for a --insecure controller); --token_file holds a bearer token of role "
               "reader or above\n"
               "  the replicas of destination group G (default: inference): state, version, "
               "and each rank's\n"
               "  version, state, last synced version and report age; --version V prints "
               "only the labels\n"
               "  of the replicas serving V (exit 1 when none does)\n");
}

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
  auto args = ParseArgs(argv, FlagSpec{{"controller", "group", "version", "timeout_ms",
                                        "controller_ca", "cert", "key", "token_file"},
                                       {"json", "help"}});
  if (!args.ok()) {
    spdlog::error("replicas: {}", std::string(args.status().message()));
    ReplicasUsage(stderr);
    return kExitUsage;
  }
  if (args->Has("help")) {
    ReplicasUsage(stdout);
    return kExitOk;
  }
  auto version = args->IntValue("version", -1);
  auto timeout_ms = args->IntValue("timeout_ms", 10000);
  absl::Status usage = !version.ok()      ? version.status()
                       : !timeout_ms.ok() ? timeout_ms.status()
                                          : absl::OkStatus();
  if (usage.ok() && args->Value("controller").empty()) {
    usage = absl::InvalidArgumentError("--controller HOST:PORT is required");
  }
  if (usage.ok() && !args->positional().empty()) {
    usage = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args->positional()[0], "'"));
  }
  if (!usage.ok()) {
    spdlog::error("replicas: {}", std::string(usage.message()));
    ReplicasUsage(stderr);
    return kExitUsage;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ControllerCredentials(*args);
  std::string token;
  if (credentials.ok() && args->Has("token_file")) {
    absl::StatusOr<std::string> text = ReadText(args->Value("token_file"));
    if (!text.ok()) credentials = text.status();
    if (text.ok()) token = std::string(absl::StripAsciiWhitespace(*text));
  }
  if (!credentials.ok()) {
    spdlog::error("replicas: {}", std::string(credentials.status().message()));
    return kExitUsage;
  }
  const std::string group = args->Has("group") ? args->Value("group") : "inference";
  auto stub =
      v1::TrainerService::NewStub(grpc::CreateChannel(args->Value("controller"), *credentials));
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(*timeout_ms));
  v1::ReplicasRequest req;
  req.set_group(group);
  v1::ReplicasResponse resp;
  const grpc::Status s = stub->Replicas(&ctx, req, &resp);
  if (!s.ok()) {
    spdlog::error("replicas of group '{}' from controller {}: {}", group, args->Value("controller"),
                  s.error_message());
    return kExitFailed;
  }
  if (*version >= 0) {
    std::vector<std::string> at;
    for (const v1::ReplicaServing& rep : resp.replicas()) {
      if (rep.state() == v1::REPLICA_SERVING && rep.version() == *version) {
        at.push_back(rep.replica());
      }
    }
    for (const std::string& label : at) std::printf("%s\n", Label(label).c_str());
    return at.empty() ? kExitFailed : kExitOk;
  }
  if (args->Has("json")) {
    std::string json;
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = true;
    if (!google::protobuf::util::MessageToJsonString(resp, &json, o).ok()) {
      spdlog::error("replicas: could not print the response of group '{}' as JSON", group);
      return kExitFailed;
    }
    std::cout << json;
    return kExitOk;
  }
  PrintTable(resp);
  return kExitOk;
}

}  // namespace wsync::tools
