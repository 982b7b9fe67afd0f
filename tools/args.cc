#include "tools/args.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace wsync::tools {
namespace {

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

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
  Args out;
  for (size_t i = 0; i < argv.size(); ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argv.size(); ++i) out.positional_.push_back(argv[i]);
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      out.positional_.push_back(argv[i]);
      continue;
    }
    std::string name(arg), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (out.Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given twice"));
    }
    if (Contains(spec.bool_flags, name)) {
      if (inline_value) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value"));
      }
      out.bools_.insert(name);
    } else if (Contains(spec.value_flags, name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
        }
        value = argv[++i];
      }
      out.values_[name] = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (accepted: ", Known(spec), ")"));
    }
  }
  return out;
}

}  // namespace wsync::tools
