// wsyncctl: command-line front end of wsync: planning and the catalog offline;
// the controller's state, workers and syncs for operators (docs/operations.md).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "controller/plan/huge_page_allocator.h"
#include "tools/subcommands.h"

namespace wsync::tools {
namespace {

constexpr Subcommand kSubcommands[] = {
    {"plan", "plan a transfer spec (file or catalog case); print summary, JSON, or verify",
     RunPlanCommand},
    {"catalog", "emit the TransferSpec JSON of a catalog case, or --list the models",
     RunCatalogCommand},
    {"replicas", "what each replica of a destination group serves (from the controller)",
     RunReplicasCommand},
    {"health", "whether the controller serves (grpc.health.v1; exit 0 when SERVING)",
     RunHealthCommand},
    {"status", "transfers, delivered versions, syncs in flight, plan cache, worker counts",
     RunStatusCommand},
    {"workers", "the registered workers: group/rank, node, pid, alive, stream, buffers, serving",
     RunWorkersCommand},
    {"sync", "start a sync of TRANSFER to VERSION (--wait: outcome and round trip; --watch)",
     RunSyncCommand},
    {"watch", "follow SYNC_ID to its end with a progress line (exit 0 on SUCCEEDED)",
     RunWatchCommand},
    {"cancel", "cancel SYNC_ID", RunCancelCommand},
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: wsyncctl <command> [args]   (wsyncctl <command> --help)\n\ncommands:\n");
  for (const Subcommand& c : kSubcommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}

int Main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  for (const Subcommand& c : kSubcommands) {
    if (c.name == std::string(argv[1])) {
      return c.run(std::vector<std::string>(argv + 2, argv + argc));
    }
  }
  spdlog::error("unknown command '{}'", argv[1]);
  Usage(stderr);
  return kExitUsage;
}

}  // namespace
}  // namespace wsync::tools

int main(int argc, char** argv) {
  wsync::InitLogging("wsyncctl");
  wsync::plan::KeepFreedMemoryForPlanning();
  return wsync::tools::Main(argc, argv);
}
