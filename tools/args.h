// The parsed flags of wsyncctl's spec-driven subcommands (plan, catalog and
// the catalog-case flags they share): positional arguments plus
// "--flag value", "--flag=value" and boolean "--flag", parsed by CLI11 from a
// declared FlagSpec, so a typo is an error instead of being ignored. The
// controller subcommands declare typed CLI11 options directly (tools/cli.h).
#ifndef WSYNC_TOOLS_ARGS_H_
#define WSYNC_TOOLS_ARGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace wsync::tools {

struct FlagSpec {
  std::vector<std::string> value_flags;  // take a value
  std::vector<std::string> bool_flags;   // presence only
};

class Args {
 public:
  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(const std::string& flag) const {
    return values_.contains(flag) || bools_.contains(flag);
  }
  // Empty when absent.
  std::string Value(const std::string& flag) const;
  absl::StatusOr<int64_t> IntValue(const std::string& flag, int64_t default_value) const;

 private:
  friend absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv, const FlagSpec& spec);
  std::vector<std::string> positional_;
  absl::flat_hash_map<std::string, std::string> values_;
  absl::flat_hash_set<std::string> bools_;
};

// INVALID_ARGUMENT naming the flag: unknown (with the accepted ones), given
// twice, a value flag without its value, a boolean flag with one.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv, const FlagSpec& spec);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_ARGS_H_
