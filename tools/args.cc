#include "tools/args.h"

#include <map>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/cli.h"

namespace wsync::tools {
namespace {

std::string Known(const FlagSpec& spec) {
  std::vector<std::string> all;
  for (const auto& f : spec.value_flags) all.push_back("--" + f);
  for (const auto& f : spec.bool_flags) all.push_back("--" + f);
  return all.empty() ? "none" : absl::StrJoin(all, " ");
}

}  // namespace

std::string Args::Value(const std::string& flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? "" : it->second;
}

absl::StatusOr<int64_t> Args::IntValue(const std::string& flag, int64_t default_value) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return default_value;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": expected an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv, const FlagSpec& spec) {
  CLI::App app;
  app.set_help_flag();  // the commands declare "help" themselves and print their usage
  std::map<std::string, std::string> values;
  std::map<std::string, CLI::Option*> value_options;
  std::map<std::string, CLI::Option*> bool_options;
  for (const std::string& f : spec.value_flags) {
    value_options[f] = app.add_option("--" + f, values[f])
                           ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
                           ->type_size(1)
                           ->allow_extra_args(false);
  }
  for (const std::string& f : spec.bool_flags) {
    bool_options[f] = app.add_flag("--" + f)->disable_flag_override()->multi_option_policy(
        CLI::MultiOptionPolicy::Throw);
  }
  Args out;
  app.add_option("positional", out.positional_);
  absl::Status parsed = ParseCli(app, argv);
  if (!parsed.ok()) {
    if (absl::StrContains(parsed.message(), "unknown flag")) {
      return absl::InvalidArgumentError(
          absl::StrCat(parsed.message(), " (accepted: ", Known(spec), ")"));
    }
    return parsed;
  }
  for (const auto& [name, option] : value_options) {
    if (option->count() > 0) out.values_[name] = values[name];
  }
  for (const auto& [name, option] : bool_options) {
    if (option->count() > 0) out.bools_.insert(name);
  }
  return out;
}

}  // namespace wsync::tools
