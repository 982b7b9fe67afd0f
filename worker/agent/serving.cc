#include "worker/agent/serving.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::agent {

ServingTable::ServingTable(std::vector<v1::Membership> memberships)
    : memberships_(std::move(memberships)) {}

absl::Status ServingTable::Set(const v1::SetServingRequest& req) {
  bool member = false;
  std::string groups;
  for (const v1::Membership& m : memberships_) {
    member |= m.group() == req.group();
    absl::StrAppend(&groups, groups.empty() ? "" : ", ", "'", m.group(), "'");
  }
  const std::string what = absl::StrCat("SetServing for group '", req.group(), "'");
  if (!member) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": this worker is not in it (its groups: ", groups, ")"));
  }
  if (req.state() == v1::SERVING_STATE_UNSPECIFIED || !v1::ServingState_IsValid(req.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": state ", req.state(), " is not one of serving, paused, updating, failed"));
  }
  if (req.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": version ", req.version(), " is negative"));
  }
  if (req.replica_ranks() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": replica_ranks ", req.replica_ranks(), " is negative"));
  }
  v1::ServingReport r;
  r.set_group(req.group());
  r.set_version(req.version());
  r.set_state(req.state());
  r.set_replica(req.replica());
  r.set_replica_ranks(req.replica_ranks());
  r.set_set_unix_ms(absl::ToUnixMillis(absl::Now()));
  absl::MutexLock lock(&mu_);
  by_group_[req.group()] = std::move(r);
  changed_ = true;
  return absl::OkStatus();
}

std::vector<v1::ServingReport> ServingTable::Reports(int64_t last_synced_version) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ServingReport> out;
  for (const auto& [group, r] : by_group_) {
    out.push_back(r);
    out.back().set_last_synced_version(last_synced_version);
  }
  return out;
}

bool ServingTable::TakeChanged() {
  absl::MutexLock lock(&mu_);
  const bool was = changed_;
  changed_ = false;
  return was;
}

void ServingTable::MarkUnsent() {
  absl::MutexLock lock(&mu_);
  changed_ = changed_ || !by_group_.empty();
}

}  // namespace wsync::agent
