#include "controller/server/rollout.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wsync::controller {

absl::Status CheckRolloutPolicy(const std::string& transfer, const v1::RolloutPolicy& policy,
                                v1::StagingMode mode) {
  const std::pair<const char*, int32_t> fields[] = {{"max_unavailable", policy.max_unavailable()},
                                                    {"max_staleness", policy.max_staleness()},
                                                    {"replica_ranks", policy.replica_ranks()}};
  for (const auto& [name, value] : fields) {
    if (value < 0 || value > kMaxRolloutValue) {
      return absl::InvalidArgumentError(absl::StrCat("transfer '", transfer, "': rollout.", name,
                                                     " = ", value, " is out of range [0, ",
                                                     kMaxRolloutValue, "]"));
    }
  }
  if (policy.max_unavailable() > 0 && mode == v1::STAGING_IN_PLACE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", transfer, "': rollout.max_unavailable = ", policy.max_unavailable(),
        " needs a staged transfer (staging.mode host_shadow or device_shadow): an in-place "
        "receiver writes its live tensors and is unavailable for the whole transfer, so "
        "waves cannot bound how many replicas pause"));
  }
  return absl::OkStatus();
}

std::string RankBlockLabel(int32_t first, int32_t n) {
  return absl::StrCat("ranks-", first, "-", first + n - 1);
}

std::vector<RolloutReplica> GroupReplicas(const std::vector<RolloutMember>& members,
                                          int32_t replica_ranks) {
  std::map<std::string, RolloutReplica> by_label;
  for (const RolloutMember& m : members) {
    std::string label = m.label;
    if (replica_ranks > 0) {
      const int32_t first = m.rank < 0 ? -1 : (m.rank / replica_ranks) * replica_ranks;
      label = first < 0 ? "" : RankBlockLabel(first, replica_ranks);
    }
    RolloutReplica& r = by_label[label];
    r.label = label;
    if (m.rank >= 0) r.ranks.push_back(m.rank);
    r.parts.push_back(m.part);
  }
  std::vector<RolloutReplica> out;
  for (auto& [label, r] : by_label) {
    std::sort(r.ranks.begin(), r.ranks.end());
    r.ranks.erase(std::unique(r.ranks.begin(), r.ranks.end()), r.ranks.end());
    out.push_back(std::move(r));
  }
  auto lowest = [](const RolloutReplica& r) {
    return r.ranks.empty() ? INT32_MAX : r.ranks.front();
  };
  std::stable_sort(out.begin(), out.end(), [&](const RolloutReplica& a, const RolloutReplica& b) {
    return lowest(a) < lowest(b);
  });
  return out;
}

std::vector<size_t> NextWave(const std::vector<ReplicaPhase>& phases, int32_t max_unavailable) {
  std::vector<size_t> wave;
  for (ReplicaPhase p : phases) {
    if (p == ReplicaPhase::kCommitting) return wave;
  }
  for (size_t i = 0; i < phases.size(); ++i) {
    if (phases[i] != ReplicaPhase::kWaiting) continue;
    if (max_unavailable > 0 && static_cast<int32_t>(wave.size()) >= max_unavailable) break;
    wave.push_back(i);
  }
  return wave;
}

int32_t WavesLeft(const std::vector<ReplicaPhase>& phases, int32_t max_unavailable) {
  int32_t waiting = 0;
  bool committing = false;
  for (ReplicaPhase p : phases) {
    waiting += p == ReplicaPhase::kWaiting ? 1 : 0;
    committing |= p == ReplicaPhase::kCommitting;
  }
  const int32_t per_wave = max_unavailable > 0 ? max_unavailable : std::max(waiting, 1);
  return (committing ? 1 : 0) + (waiting + per_wave - 1) / per_wave;
}

absl::Status CheckStaleness(const std::string& transfer, int64_t version, int64_t last_delivered,
                            int32_t max_staleness,
                            const std::vector<v1::ReplicaVersion>& replicas) {
  if (max_staleness <= 0) return absl::OkStatus();
  std::vector<std::string> behind;
  for (const v1::ReplicaVersion& r : replicas) {
    if (r.version() <= 0 || version - r.version() <= max_staleness) continue;
    behind.push_back(absl::StrCat(
        "replica '", r.replica(), "' (ranks ", absl::StrJoin(r.ranks(), ","), ") serves version ",
        r.version(), r.state() == "uncommitted" ? " (a rank did not commit a later one)" : ""));
  }
  if (behind.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "Sync: version ", version, " of transfer '", transfer, "' refused: ",
      absl::StrJoin(behind, "; "), ", more than rollout.max_staleness = ", max_staleness,
      " versions behind it (the controller's view); resend version ", last_delivered,
      " (resend=True) to bring them up first, or raise rollout.max_staleness"));
}

}  // namespace wsync::controller
