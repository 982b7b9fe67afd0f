#include "controller/server/serving_board.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace wsync::controller {

namespace {

// The rank as the board shows it, with its replica label.
struct RankView {
  v1::RankServing rank;
  std::string replica;
  int32_t replica_ranks = 0;
};

RankView ViewOf(int32_t rank, const std::string& holder, const v1::ServingReport* report,
                const std::string& report_lease, absl::Time received, absl::Time now) {
  RankView v;
  v.rank.set_rank(rank);
  v.rank.set_ms_since_report(-1);
  v.rank.set_live(!holder.empty());
  if (report == nullptr) return v;
  v.replica = report->replica();
  v.replica_ranks = report->replica_ranks();
  v.rank.set_version(report->version());
  v.rank.set_state(report->state());
  v.rank.set_last_synced_version(report->last_synced_version());
  v.rank.set_set_unix_ms(report->set_unix_ms());
  v.rank.set_ms_since_report(absl::ToInt64Milliseconds(now - received));
  // A report counts only while the lease that sent it holds the rank.
  v.rank.set_reported(!holder.empty() && holder == report_lease);
  return v;
}

v1::ReplicaServing Summarize(const std::string& label, std::vector<RankView>& ranks,
                             int32_t expected) {
  v1::ReplicaServing r;
  r.set_replica(label);
  r.set_expected_ranks(expected);
  bool missing = static_cast<int32_t>(ranks.size()) < expected;
  bool failed = false, updating = false, paused = false;
  std::set<int64_t> versions;
  int64_t last_synced = -1;
  for (RankView& v : ranks) {
    const v1::RankServing& rs = v.rank;
    if (!rs.live() || !rs.reported()) {
      missing = true;
    } else {
      failed |= rs.state() == v1::SERVING_STATE_FAILED;
      updating |= rs.state() == v1::SERVING_STATE_UPDATING;
      paused |= rs.state() == v1::SERVING_STATE_PAUSED;
      versions.insert(rs.version());
      last_synced = last_synced < 0 ? rs.last_synced_version()
                                    : std::min(last_synced, rs.last_synced_version());
    }
    *r.add_ranks() = std::move(v.rank);
  }
  r.set_last_synced_version(std::max<int64_t>(0, last_synced));
  if (missing) {
    r.set_state(v1::REPLICA_INCOMPLETE);
  } else if (failed) {
    r.set_state(v1::REPLICA_FAILED);
  } else if (updating) {
    r.set_state(v1::REPLICA_UPDATING);
  } else if (paused) {
    r.set_state(v1::REPLICA_PAUSED);
  } else if (versions.size() == 1) {
    r.set_state(v1::REPLICA_SERVING);
    r.set_version(*versions.begin());
  } else {
    r.set_state(v1::REPLICA_MIXED);
  }
  return r;
}

}  // namespace

const char* ReplicaStateName(v1::ReplicaState s) {
  switch (s) {
    case v1::REPLICA_SERVING:
      return "serving";
    case v1::REPLICA_MIXED:
      return "mixed";
    case v1::REPLICA_PAUSED:
      return "paused";
    case v1::REPLICA_UPDATING:
      return "updating";
    case v1::REPLICA_FAILED:
      return "failed";
    case v1::REPLICA_INCOMPLETE:
      return "incomplete";
    default:
      return "unknown";
  }
}

ServingBoard::ServingBoard(ControllerMetrics* metrics, absl::Duration forget_after)
    : metrics_(metrics), forget_after_(forget_after) {}

absl::Status ServingBoard::Record(
    const std::string& lease_id,
    const google::protobuf::RepeatedPtrField<v1::Membership>& memberships,
    const google::protobuf::RepeatedPtrField<v1::ServingReport>& reports, absl::Time now) {
  std::vector<std::pair<int32_t, const v1::ServingReport*>> checked;
  absl::flat_hash_set<std::string> seen;
  for (const v1::ServingReport& rep : reports) {
    const v1::Membership* m = nullptr;
    for (const v1::Membership& mm : memberships) {
      if (mm.group() == rep.group()) m = &mm;
    }
    if (m == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("serving report for group '", rep.group(),
                                                     "': lease ", lease_id,
                                                     " is not a member of it"));
    }
    if (!seen.insert(rep.group()).second) {
      return absl::InvalidArgumentError(absl::StrCat("serving report for group '", rep.group(),
                                                     "' repeated by lease ", lease_id));
    }
    if (rep.state() == v1::SERVING_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("serving report for group '", rep.group(),
                                                     "' rank ", m->rank(), " of lease ", lease_id,
                                                     " has no state"));
    }
    checked.emplace_back(m->rank(), &rep);
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [rank, rep] : checked) {
    groups_[rep->group()][rank] = Entry{lease_id, *rep, now};
  }
  return absl::OkStatus();
}

v1::ReplicasResponse ServingBoard::Replicas(const std::string& group, const GroupHolders& holders,
                                            absl::Time now) {
  std::map<std::string, std::vector<RankView>> by_label;
  std::map<std::string, int32_t> expected;
  {
    absl::MutexLock lock(&mu_);
    std::map<int32_t, Entry>& entries = groups_[group];
    auto holder = [&](int32_t rank) -> std::string {
      return rank >= 0 && rank < static_cast<int32_t>(holders.leases.size()) ? holders.leases[rank]
                                                                             : std::string();
    };
    for (auto it = entries.begin(); it != entries.end();) {
      const bool held_by_it = holder(it->first) == it->second.lease_id;
      if (!held_by_it && now - it->second.received > forget_after_) {
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
    const int32_t size = std::max<int32_t>(holders.size, 0);
    std::set<int32_t> ranks;
    for (int32_t r = 0; r < size; ++r) ranks.insert(r);
    for (const auto& [r, e] : entries) ranks.insert(r);
    for (int32_t r : ranks) {
      auto e = entries.find(r);
      RankView v = e == entries.end() ? ViewOf(r, holder(r), nullptr, "", now, now)
                                      : ViewOf(r, holder(r), &e->second.report, e->second.lease_id,
                                               e->second.received, now);
      int32_t& want = expected[v.replica];
      want = std::max(want, v.replica_ranks);
      by_label[v.replica].push_back(std::move(v));
    }
    if (entries.empty()) groups_.erase(group);
  }
  // The unlabelled replica expects the group's ranks not reported under a label.
  if (by_label.count("") != 0 && holders.size > 0) {
    int32_t labelled = 0;
    for (const auto& [label, views] : by_label) {
      if (label.empty()) continue;
      for (const RankView& v : views) labelled += v.rank.rank() < holders.size ? 1 : 0;
    }
    expected[""] = std::max(expected[""], holders.size - labelled);
  }
  v1::ReplicasResponse resp;
  resp.set_group(group);
  resp.set_group_size(holders.size);
  for (auto& [label, views] : by_label) {
    *resp.add_replicas() = Summarize(
        label, views, std::max<int32_t>(expected[label], static_cast<int32_t>(views.size())));
  }
  return resp;
}

std::string ServingBoard::LabelOf(const std::string& group, int32_t rank,
                                  const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  auto g = groups_.find(group);
  if (g == groups_.end()) return "";
  auto e = g->second.find(rank);
  if (e == g->second.end() || e->second.lease_id != lease_id) return "";
  return e->second.report.replica();
}

std::vector<std::string> ServingBoard::Groups() {
  absl::MutexLock lock(&mu_);
  std::set<std::string> out = exported_;
  for (const auto& [g, entries] : groups_) out.insert(g);
  return std::vector<std::string>(out.begin(), out.end());
}

void ServingBoard::Export(const v1::ReplicasResponse& r) {
  if (metrics_ == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (r.replicas().empty()) {
      exported_.erase(r.group());
    } else {
      exported_.insert(r.group());
    }
  }
  std::vector<ControllerMetrics::ReplicaGauge> gauges;
  for (const v1::ReplicaServing& rep : r.replicas()) {
    gauges.push_back(
        {rep.replica(), ReplicaStateName(rep.state()), static_cast<double>(rep.version())});
  }
  metrics_->SetReplicas(r.group(), gauges);
}

}  // namespace wsync::controller
