// `wsyncctl status` and `wsyncctl workers`: the controller's transfers and
// workers for operators (TrainerService.GetStatus / ListWorkers, role
// reader). A table by default, --json for machines.
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"
#include "tools/cli.h"
#include "tools/controller_channel.h"
#include "tools/subcommands.h"
#include "tools/sync_output.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::tools {
namespace {

void PrintStatus(const v1::GetStatusResponse& r) {
  std::printf("controller %s: %d workers registered, %d alive; plan cache %lld hits, %lld misses\n",
              r.controller_instance().c_str(), r.workers_registered(), r.workers_alive(),
              static_cast<long long>(r.plan_cache_hits()),
              static_cast<long long>(r.plan_cache_misses()));
  std::printf("%-20s %-28s %10s %10s  %s\n", "TRANSFER", "SOURCE -> DESTINATION", "DELIVERED",
              "IN FLIGHT", "LAST SYNC");
  for (const v1::TransferStatus& t : r.transfers()) {
    const v1::SyncStatus& last = t.last_sync();
    const std::string in_flight =
        t.in_flight_version() > 0 ? absl::StrCat(t.in_flight_version()) : "-";
    std::string last_text = "-";
    if (!last.sync_id().empty()) {
      last_text = absl::StrFormat("%s v%d %s %.3f s", last.sync_id(), last.version(),
                                  PhaseName(last.phase()), last.elapsed_seconds());
      if (last.phase() == v1::SYNC_RUNNING) {
        last_text += absl::StrFormat(" (%d/%d workers)", last.workers_done(), last.workers_total());
        if (last.rollout().waves_total() > 0) {
          last_text += absl::StrFormat(" waves %d/%d", last.rollout().waves_done(),
                                       last.rollout().waves_total());
        }
      } else if (!last.error().empty()) {
        last_text += absl::StrCat(": ", last.error());
      }
    }
    std::printf("%-20s %-28s %10lld %10s  %s\n", t.name().c_str(),
                absl::StrCat(t.source_group(), " -> ", t.destination_group()).c_str(),
                static_cast<long long>(t.last_success_version()), in_flight.c_str(),
                last_text.c_str());
    // What each replica confirmed (docs/staging-rollout.md, "Rolling waves").
    std::vector<std::string> replicas;
    for (const v1::ReplicaVersion& rv : t.replicas()) {
      replicas.push_back(absl::StrCat(rv.replica().empty() ? "(unlabelled)" : rv.replica(), " v",
                                      rv.version(), rv.state() == "serving" ? "" : " uncommitted"));
    }
    if (!replicas.empty())
      std::printf("%20s replicas: %s\n", "", absl::StrJoin(replicas, ", ").c_str());
  }
}

// Every page of ListWorkers for `group` ("" all).
absl::StatusOr<std::vector<v1::RegisteredWorker>> AllWorkers(const Controller& controller,
                                                             v1::TrainerService::Stub& stub,
                                                             const std::string& group,
                                                             int64_t timeout_ms) {
  std::vector<v1::RegisteredWorker> out;
  v1::ListWorkersRequest req;
  req.set_group(group);
  do {
    grpc::ClientContext ctx;
    controller.Prepare(&ctx, timeout_ms);
    v1::ListWorkersResponse resp;
    const grpc::Status s = stub.ListWorkers(&ctx, req, &resp);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("ListWorkers (page ",
                                                 req.page_token().empty() ? "1" : req.page_token(),
                                                 "): ", DescribeRpcError(s)));
    }
    for (v1::RegisteredWorker& w : *resp.mutable_workers()) out.push_back(std::move(w));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return out;
}

// (group, rank) -> the version the rank serves, from Replicas of each group;
// a group whose Replicas fails is left out (its ranks show "-").
std::map<std::pair<std::string, int>, int64_t> ServingVersions(
    const Controller& controller, v1::TrainerService::Stub& stub,
    const std::vector<v1::RegisteredWorker>& workers, int64_t timeout_ms) {
  std::map<std::pair<std::string, int>, int64_t> out;
  std::map<std::string, bool> asked;
  for (const v1::RegisteredWorker& w : workers) {
    for (const v1::Membership& m : w.memberships()) {
      if (asked[m.group()]) continue;
      asked[m.group()] = true;
      grpc::ClientContext ctx;
      controller.Prepare(&ctx, timeout_ms);
      v1::ReplicasRequest req;
      req.set_group(m.group());
      v1::ReplicasResponse resp;
      if (!stub.Replicas(&ctx, req, &resp).ok()) continue;
      for (const v1::ReplicaServing& rep : resp.replicas()) {
        for (const v1::RankServing& rank : rep.ranks()) {
          if (rank.reported()) out[{m.group(), rank.rank()}] = rank.version();
        }
      }
    }
  }
  return out;
}

void PrintWorkers(const std::vector<v1::RegisteredWorker>& workers,
                  const std::map<std::pair<std::string, int>, int64_t>& serving) {
  std::printf("%-24s %-16s %8s %-5s %-6s %7s %s\n", "GROUP/RANK", "NODE", "PID", "ALIVE", "STREAM",
              "BUFFERS", "SERVING");
  for (const v1::RegisteredWorker& w : workers) {
    std::vector<std::string> ranks, versions;
    for (const v1::Membership& m : w.memberships()) {
      ranks.push_back(absl::StrCat(m.group(), "/", m.rank()));
      auto it = serving.find({m.group(), m.rank()});
      if (it != serving.end()) versions.push_back(absl::StrCat(m.group(), ":v", it->second));
    }
    std::printf("%-24s %-16s %8lld %-5s %-6s %7d %s\n", absl::StrJoin(ranks, ",").c_str(),
                w.node().c_str(), static_cast<long long>(w.pid()), w.alive() ? "yes" : "no",
                w.streaming() ? "open" : "closed", w.buffer_count(),
                versions.empty() ? "-" : absl::StrJoin(versions, ",").c_str());
  }
}

}  // namespace

int RunStatusCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "The controller's state (TrainerService.GetStatus; role reader): each transfer with its "
      "last delivered version, the sync in flight and the last sync; plan cache hits and "
      "misses; workers registered and alive.",
      "status");
  ChannelOptions options;
  AddChannelOptions(app, &options, 10000);
  bool json = false;
  app.add_flag("--json", json, "the GetStatusResponse as JSON (proto field names)");
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  v1::GetStatusResponse resp;
  const grpc::Status s = controller->CallTrainer(&v1::TrainerService::Stub::GetStatus,
                                                 v1::GetStatusRequest(), &resp, options.timeout_ms);
  if (!s.ok()) {
    spdlog::error("status of controller {}: {}", options.controller, DescribeRpcError(s));
    return kExitFailed;
  }
  if (!json) {
    PrintStatus(resp);
    return kExitOk;
  }
  return PrintJson(resp, "status");
}

int RunWorkersCommand(const std::vector<std::string>& argv) {
  CLI::App app(
      "The registered workers (TrainerService.ListWorkers, every page; role reader): "
      "group/rank, node, pid, alive, Assignments stream open, buffers, and the version each "
      "rank serves (from Replicas).",
      "workers");
  ChannelOptions options;
  AddChannelOptions(app, &options, 10000);
  std::string group;
  bool json = false;
  app.add_option("--group", group, "only the workers of group G (default: all)")->type_name("G");
  app.add_flag("--json", json, "every page as one ListWorkersResponse in JSON (proto field names)");
  if (std::optional<int> exit = ParseCommand(app, argv)) return *exit;
  int exit = kExitUsage;
  std::optional<Controller> controller = ConnectForCommand(app, options, &exit);
  if (!controller.has_value()) return exit;
  auto stub = v1::TrainerService::NewStub(controller->channel);
  absl::StatusOr<std::vector<v1::RegisteredWorker>> workers =
      AllWorkers(*controller, *stub, group, options.timeout_ms);
  if (!workers.ok()) {
    spdlog::error("workers{} of controller {}: {}",
                  group.empty() ? "" : " of group '" + group + "'", options.controller,
                  std::string(workers.status().message()));
    return kExitFailed;
  }
  if (!json) {
    PrintWorkers(*workers, ServingVersions(*controller, *stub, *workers, options.timeout_ms));
    return kExitOk;
  }
  v1::ListWorkersResponse all;  // every page in one, next_page_token empty
  for (v1::RegisteredWorker& w : *workers) *all.add_workers() = std::move(w);
  return PrintJson(all, "workers");
}

}  // namespace wsync::tools
