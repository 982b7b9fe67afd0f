// wsyncctl's subcommands. To add one: write `int RunXCommand(const
// std::vector<std::string>& args)` in its own file (options on a CLI::App,
// tools/cli.h), declare it here and add a row to kSubcommands in wsyncctl.cc.
// Exit codes: 0 success, 1 the operation failed (planning, verification, a
// sync that did not succeed, the controller's refusal), 2 bad usage or
// unreadable input.
#ifndef WSYNC_TOOLS_SUBCOMMANDS_H_
#define WSYNC_TOOLS_SUBCOMMANDS_H_

#include <string>
#include <vector>

namespace wsync::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);  // args after the subcommand name
};

int RunPlanCommand(const std::vector<std::string>& args);
int RunCatalogCommand(const std::vector<std::string>& args);
int RunReplicasCommand(const std::vector<std::string>& args);
int RunHealthCommand(const std::vector<std::string>& args);
int RunStatusCommand(const std::vector<std::string>& args);
int RunWorkersCommand(const std::vector<std::string>& args);
int RunSyncCommand(const std::vector<std::string>& args);
int RunWatchCommand(const std::vector<std::string>& args);
int RunCancelCommand(const std::vector<std::string>& args);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_SUBCOMMANDS_H_
