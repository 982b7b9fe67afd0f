// absl flags with WSYNC_* environment fallbacks: an environment variable
// WSYNC_<FLAG_NAME_UPPERCASE> sets a flag's value; the command line wins.
#ifndef WSYNC_COMMON_ENV_FLAGS_H_
#define WSYNC_COMMON_ENV_FLAGS_H_

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/logging.h"

namespace wsync {

// Applies WSYNC_* variables for `names`, then parses argv (--help lists the
// flags defined in files whose path contains `help_path_fragment`). Returns
// the positional arguments; exits on a bad value.
inline std::vector<char*> ParseFlagsWithEnv(int argc, char** argv, const char* usage,
                                            const char* help_path_fragment,
                                            std::initializer_list<const char*> names) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  std::string fragment = help_path_fragment;
  config.contains_help_flags = [fragment](absl::string_view path) {
    return absl::StrContains(path, fragment);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  for (const char* name : names) {
    std::string env = "WSYNC_" + absl::AsciiStrToUpper(name);
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      spdlog::error("bad value for {}={}: {}", env, value, error);
      std::exit(2);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace wsync

#endif  // WSYNC_COMMON_ENV_FLAGS_H_
