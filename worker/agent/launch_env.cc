#include "worker/agent/launch_env.h"

#include <unistd.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace wsync::agent {
namespace {

// An integer read from the environment (or a name's ordinal) and where from.
struct Sourced {
  int64_t value = 0;
  std::string source;  // e.g. "RANK=3" or "HOSTNAME=vllm-3"
};

const char* const kRankVars[] = {"RANK", "WSYNC_RANK", "JOB_COMPLETION_INDEX"};
const char* const kNameVars[] = {"POD_NAME", "HOSTNAME"};
const char* const kSizeVars[] = {"WSYNC_GROUP_SIZE", "WORLD_SIZE"};

std::string Get(const EnvMap& env, const std::string& var) {
  auto it = env.find(var);
  return it == env.end() ? "" : std::string(absl::StripAsciiWhitespace(it->second));
}

std::string Shown(const EnvMap& env, const std::string& var) {
  auto it = env.find(var);
  return it == env.end() ? absl::StrCat(var, " (unset)") : absl::StrCat(var, "='", it->second, "'");
}

// `var` as an integer; nullopt when unset or empty.
absl::StatusOr<std::optional<Sourced>> ReadInt(const EnvMap& env, const std::string& var,
                                               const char* what) {
  const std::string text = Get(env, var);
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(var, "='", text, "' is not an integer (read as the worker's ", what, ")"));
  }
  return Sourced{value, absl::StrCat(var, "=", text)};
}

// The first of `vars` that is set; two set to different values is an error.
absl::StatusOr<std::optional<Sourced>> ReadAgreeing(const EnvMap& env,
                                                    const std::vector<std::string>& vars,
                                                    const char* what) {
  std::optional<Sourced> first;
  for (const std::string& var : vars) {
    auto v = ReadInt(env, var, what);
    if (!v.ok()) return v.status();
    if (!v->has_value()) continue;
    if (!first.has_value()) {
      first = **v;
    } else if ((*v)->value != first->value) {
      return absl::InvalidArgumentError(absl::StrCat(
          "conflicting ", what, "s in the environment: ", first->source, " but ", (*v)->source));
    }
  }
  return first;
}

absl::StatusOr<Sourced> EnvRank(const EnvMap& env, const std::string& group) {
  auto rank = ReadAgreeing(env, {std::begin(kRankVars), std::end(kRankVars)}, "rank");
  if (!rank.ok()) return rank.status();
  if (rank->has_value()) return **rank;
  std::vector<std::string> read;
  for (const char* var : kRankVars) read.push_back(Shown(env, var));
  // A pod's name ends in its StatefulSet ordinal; outside Kubernetes a host
  // named like "gpu-node-3" says nothing about a rank.
  const bool in_pod = !Get(env, "KUBERNETES_SERVICE_HOST").empty();
  for (const char* var : kNameVars) {
    if (!in_pod) {
      read.push_back(absl::StrCat(Shown(env, var), " (not in a Kubernetes pod)"));
      continue;
    }
    const std::string name = Get(env, var);
    const int64_t ordinal = NameOrdinal(name);
    if (ordinal >= 0) return Sourced{ordinal, absl::StrCat(var, "=", name)};
    read.push_back(name.empty() ? Shown(env, var)
                                : absl::StrCat(Shown(env, var), " (no '-<ordinal>' ending)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no rank for group '", group, "': read ", absl::StrJoin(read, ", "),
                   "; give --groups=", group, ":RANK:SIZE or set RANK (or JOB_COMPLETION_INDEX)"));
}

absl::StatusOr<Sourced> EnvSize(const EnvMap& env, const std::string& group) {
  auto size = ReadAgreeing(env, {std::begin(kSizeVars), std::end(kSizeVars)}, "group size");
  if (!size.ok()) return size.status();
  if (size->has_value()) return **size;
  return absl::InvalidArgumentError(absl::StrCat(
      "no size for group '", group, "': read ", Shown(env, kSizeVars[0]), ", ",
      Shown(env, kSizeVars[1]), "; give --groups=", group, ":SIZE or set WSYNC_GROUP_SIZE"));
}

// The groups text and where it came from.
absl::StatusOr<std::pair<std::string, std::string>> GroupsText(const LaunchFlags& flags,
                                                               const EnvMap& env,
                                                               std::vector<std::string>* notes) {
  const std::string groups_env = Get(env, "WSYNC_GROUPS");
  const std::string group_env = Get(env, "WSYNC_GROUP");
  if (!groups_env.empty() && !group_env.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "both WSYNC_GROUPS='", groups_env, "' and WSYNC_GROUP='", group_env, "' are set: set one"));
  }
  if (!flags.groups.empty()) {
    const bool from_env = flags.groups == groups_env;
    if (!group_env.empty()) {
      notes->push_back(absl::StrCat("WSYNC_GROUP='", group_env, "' not used: --groups given"));
    }
    return std::make_pair(flags.groups, from_env ? std::string("WSYNC_GROUPS") : "--groups");
  }
  if (!group_env.empty()) return std::make_pair(group_env, std::string("WSYNC_GROUP"));
  return absl::InvalidArgumentError(
      "no groups: pass --groups (group:rank:size, or group / group:size with the rank from "
      "RANK, JOB_COMPLETION_INDEX or the pod name), or set WSYNC_GROUPS or WSYNC_GROUP");
}

absl::Status ResolveDevice(const LaunchFlags& flags, const EnvMap& env, LaunchSettings* out) {
  if (flags.device_given) {
    out->device = flags.device;
    out->sources.push_back(absl::StrCat("device ", flags.device, " from --device/WSYNC_DEVICE"));
    return absl::OkStatus();
  }
  auto local = ReadInt(env, "LOCAL_RANK", "local rank (its CUDA device)");
  if (!local.ok()) return local.status();
  if (!local->has_value()) {
    out->sources.push_back("device -1 (host memory): no --device, WSYNC_DEVICE or LOCAL_RANK");
    return absl::OkStatus();
  }
  const Sourced& l = **local;
  if (!flags.cuda_built) {
    out->sources.push_back(absl::StrCat("device -1 (host memory): ", l.source,
                                        " not used, this build has no CUDA backend"));
    return absl::OkStatus();
  }
  if (l.value < 0 || l.value > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(l.source, " is not a CUDA device index (want >= 0)"));
  }
  out->device = static_cast<int32_t>(l.value);
  out->sources.push_back(absl::StrCat("device ", l.value, " from ", l.source));
  return absl::OkStatus();
}

}  // namespace

int64_t NameOrdinal(const std::string& name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || dash + 1 >= name.size() || name.size() - dash - 1 > 9) {
    return -1;
  }
  int64_t ordinal = 0;
  for (size_t i = dash + 1; i < name.size(); ++i) {
    if (!absl::ascii_isdigit(name[i])) return -1;
    ordinal = ordinal * 10 + (name[i] - '0');
  }
  return ordinal;
}

absl::StatusOr<LaunchSettings> ResolveLaunch(const LaunchFlags& flags, const EnvMap& env) {
  LaunchSettings out;
  auto text = GroupsText(flags, env, &out.sources);
  if (!text.ok()) return text.status();
  const auto& [groups, groups_from] = *text;
  for (absl::string_view item : absl::StrSplit(groups, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    const std::string bad = absl::StrCat("bad membership '", item, "' in ", groups_from, "='",
                                         groups, "' (want group, group:size or group:rank:size)");
    if (parts.size() > 3 || parts[0].empty()) return absl::InvalidArgumentError(bad);
    const std::string& group = parts[0];
    Sourced rank;
    Sourced size;
    if (parts.size() == 3) {
      if (!absl::SimpleAtoi(parts[1], &rank.value)) return absl::InvalidArgumentError(bad);
      rank.source = groups_from;
    } else {
      auto r = EnvRank(env, group);
      if (!r.ok()) return r.status();
      rank = *r;
    }
    if (parts.size() >= 2) {
      if (!absl::SimpleAtoi(parts.back(), &size.value)) return absl::InvalidArgumentError(bad);
      size.source = groups_from;
    } else {
      auto s = EnvSize(env, group);
      if (!s.ok()) return s.status();
      size = *s;
    }
    if (size.value < 1 || size.value > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("group '", group, "': size ", size.value,
                                                     " (from ", size.source, ") must be >= 1"));
    }
    if (rank.value < 0 || rank.value >= size.value) {
      return absl::InvalidArgumentError(
          absl::StrCat("group '", group, "': rank ", rank.value, " (from ", rank.source,
                       ") is outside [0, ", size.value, ") (size from ", size.source, ")"));
    }
    v1::Membership m;
    m.set_group(group);
    m.set_rank(static_cast<int32_t>(rank.value));
    m.set_group_size(static_cast<int32_t>(size.value));
    out.memberships.push_back(m);
    out.sources.push_back(absl::StrCat("group '", group, "': rank ", rank.value, " from ",
                                       rank.source, ", size ", size.value, " from ", size.source));
  }
  if (out.memberships.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(groups_from, "='", groups, "' names no group"));
  }
  absl::Status device = ResolveDevice(flags, env, &out);
  if (!device.ok()) return device;
  return out;
}

EnvMap ProcessEnvironment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

}  // namespace wsync::agent
