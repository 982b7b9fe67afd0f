#include "tools/cli.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "tools/subcommands.h"

namespace wsync::tools {
namespace {

absl::Status Describe(const CLI::App& app, const CLI::ParseError& e) {
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    for (const std::string& extra : app.remaining()) {
      if (absl::StartsWith(extra, "-")) {
        const std::string name = extra.substr(0, extra.find('='));
        return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
      }
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", extra, "'"));
    }
  }
  return absl::InvalidArgumentError(e.what());
}

}  // namespace

absl::Status ParseCli(CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return Describe(app, e);
  }
  return absl::OkStatus();
}

int UsageError(const CLI::App& app, const std::string& message) {
  spdlog::error("{}: {}", app.get_name(), message);
  std::fprintf(stderr, "(wsyncctl %s --help for usage)\n", app.get_name().c_str());
  return kExitUsage;
}

std::optional<int> ParseCommand(CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    return UsageError(app, std::string(Describe(app, e).message()));
  }
  return std::nullopt;
}

}  // namespace wsync::tools
