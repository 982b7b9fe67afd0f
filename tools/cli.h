// wsyncctl's command-line parsing on CLI11 (Debian's libcli11-dev): every
// subcommand declares its options on a CLI::App and parses the arguments that
// follow its name here, so errors read the same everywhere.
#ifndef WSYNC_TOOLS_CLI_H_
#define WSYNC_TOOLS_CLI_H_

#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace wsync::tools {

// Parses `argv` (the arguments after the subcommand's name) into `app`'s
// options. INVALID_ARGUMENT naming what was wrong: "unknown flag --x",
// "unexpected argument 'y'", or CLI11's text naming the flag and what it
// expected. A --help flag of `app` is the caller's (see ParseCommand).
absl::Status ParseCli(CLI::App& app, const std::vector<std::string>& argv);

// For subcommands with CLI11's own --help: nullopt when the command should
// go on; otherwise its exit code, 0 after printing app.help() to stdout for
// --help, 2 (kExitUsage) after logging "<app name>: <error>" and a pointer
// to --help on stderr.
std::optional<int> ParseCommand(CLI::App& app, const std::vector<std::string>& argv);

// Logs "<command>: <message>" and the --help pointer; returns kExitUsage.
int UsageError(const CLI::App& app, const std::string& message);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_CLI_H_
