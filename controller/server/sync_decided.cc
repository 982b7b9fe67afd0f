// SyncCoordinator: a staged sync's commit decision survives a controller
// restart (docs/staging.md, "The commit rule"). The decision is saved with
// the state file before the first CommitSync goes out; a restarted controller
// restores the sync (running, decided, its unconfirmed receivers without a
// lease) and tells each receiver that registers again (Rejoin) which
// decisions await it: a receiver that still holds the shadow commits, one
// that already committed confirms again, any other is listed uncommitted.
// Receivers that never come back are listed uncommitted at the deadline.
// Rolling waves: each wave is saved before it is sent (commit_sent); a
// receiver whose wave had not started is told to wait for its CommitSync.
#include <signal.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/staging_limits.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {
namespace {

// Participant `roles` and registration `memberships` share a group rank.
bool SameRank(const std::vector<v1::Membership>& roles,
              const google::protobuf::RepeatedPtrField<v1::Membership>& memberships) {
  for (const v1::Membership& r : roles) {
    for (const v1::Membership& m : memberships) {
      if (r.group() == m.group() && r.rank() == m.rank()) return true;
    }
  }
  return false;
}

std::string RolesOf(const std::vector<v1::Membership>& roles) {
  std::string out;
  for (const v1::Membership& r : roles) {
    absl::StrAppend(&out, out.empty() ? "" : "+", r.group(), "/", r.rank());
  }
  return out;
}

}  // namespace

void SyncCoordinator::SaveDecidedLocked(v1::ControllerState* state) {
  for (const auto& [id, sync] : syncs_) {
    if (sync->finished() || !sync->status.commit_decided()) continue;
    v1::DecidedSync* d = state->add_decided_syncs();
    *d->mutable_status() = sync->status;
    d->set_deadline_unix_ms(absl::ToUnixMillis(sync->deadline));
    *d->mutable_staging() = sync->staging;
    *d->mutable_rollout() = sync->rollout;
    d->set_waves_started(sync->next_wave);
    for (const Participant& p : sync->parts) {
      v1::DecidedParticipant* dp = d->add_participants();
      dp->set_worker(p.worker);
      for (const v1::Membership& r : p.roles) *dp->add_roles() = r;
      dp->set_receiver(p.stages);
      dp->set_done(p.done);
      dp->set_bytes_done(p.bytes_done);
      dp->set_bytes_planned(p.bytes_planned);
      dp->set_commit_sent(p.commit_sent);
      if (p.replica >= 0 && p.replica < static_cast<int32_t>(sync->replicas.size())) {
        dp->set_replica(sync->replicas[p.replica].label);
        dp->set_wave(sync->replicas[p.replica].wave);
      } else {
        dp->set_wave(-1);
      }
      dp->set_decision_slack_ms(absl::ToInt64Milliseconds(p.decision_slack));
      dp->set_held(p.held);
    }
  }
}

void SyncCoordinator::RestoreDecidedLocked(const v1::ControllerState& state) {
  const absl::Time now = absl::Now();
  for (const v1::DecidedSync& d : state.decided_syncs()) {
    const std::string& id = d.status().sync_id();
    auto tit = transfers_.find(d.status().transfer());
    if (tit == transfers_.end() || syncs_.contains(id)) {
      spdlog::error(
          "[controller] state: decided sync {} of unknown transfer '{}' (or listed "
          "twice) ignored",
          id, d.status().transfer());
      continue;
    }
    auto sync = std::make_shared<SyncRecord>();
    sync->status = d.status();
    sync->status.set_phase(v1::SYNC_RUNNING);
    sync->status.set_commit_decided(true);
    sync->start = now - absl::Seconds(d.status().elapsed_seconds());
    sync->deadline = absl::FromUnixMillis(d.deadline_unix_ms());
    sync->staging = d.staging();
    sync->rollout = d.rollout();
    sync->next_wave = d.waves_started();
    std::vector<RolloutMember> members;  // the replicas as saved
    std::map<std::string, int32_t> waves;
    for (const v1::DecidedParticipant& dp : d.participants()) {
      Participant p;
      p.worker = dp.worker();
      p.roles.assign(dp.roles().begin(), dp.roles().end());
      p.stages = dp.receiver();
      p.staged = dp.receiver();
      p.done = dp.done();
      p.bytes_done = dp.bytes_done();
      p.bytes_planned = dp.bytes_planned();
      if (dp.has_decision_slack_ms()) {
        // Clamped (a file edited by hand): as RegisterWorker bounds it.
        p.decision_slack =
            absl::Milliseconds(std::clamp<int64_t>(dp.decision_slack_ms(), 0, kMaxDecisionSlackMs));
      }
      p.held = dp.held();
      if (p.stages && !p.done) {
        p.lost = "not registered again since the controller restarted";
        p.lost_since = now;
      }
      p.pushed = now;
      // A file saved before rolling waves (no wave started): every receiver
      // was sent its CommitSync at the decision.
      p.commit_sent = dp.commit_sent() || (d.waves_started() == 0 && p.stages);
      if (p.stages) {
        RolloutMember m;
        m.part = sync->parts.size();
        m.label = dp.replica();
        for (const v1::Membership& r : dp.roles()) {
          if (r.group() == tit->second.destination_group) m.rank = r.rank();
        }
        members.push_back(std::move(m));
        int32_t& wave = waves.emplace(dp.replica(), -1).first->second;
        wave = std::max(wave, dp.wave());
      }
      sync->parts.push_back(std::move(p));  // no lease until it registers (Rejoin)
    }
    // The replicas as grouped at the decision (their labels were saved).
    sync->replicas = GroupReplicas(members, /*replica_ranks=*/0);
    for (size_t r = 0; r < sync->replicas.size(); ++r) {
      sync->replicas[r].wave = waves[sync->replicas[r].label];
      for (size_t part : sync->replicas[r].parts) {
        sync->parts[part].replica = static_cast<int32_t>(r);
      }
    }
    RefreshRolloutLocked(*sync);
    tit->second.in_flight = id;
    spdlog::warn(
        "[controller] sync {} (version {} of '{}'): its commit was decided by instance {}; "
        "resuming the commit phase for receivers that register again (deadline in {})",
        id, d.status().version(), d.status().transfer(), state.saved_by_instance(),
        absl::FormatDuration(sync->deadline - now));
    syncs_[id] = std::move(sync);
    sync_order_.push_back(id);
  }
}

void SyncCoordinator::Rejoin(const std::string& lease_id, const v1::RegisterWorkerRequest& req,
                             v1::RegisterWorkerResponse* resp) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, sync] : syncs_) {
    if (sync->finished() || !sync->status.commit_decided()) continue;
    for (Participant& p : sync->parts) {
      if (p.done || !p.stages || !SameRank(p.roles, req.memberships())) continue;
      if (!p.lease_id.empty() && workers_->IsAlive(p.lease_id)) continue;
      p.lease_id = lease_id;
      p.lost.clear();
      v1::DecidedCommit* c = resp->add_decided_commits();
      c->set_sync_id(id);
      c->set_transfer(sync->status.transfer());
      c->set_version(sync->status.version());
      // Rolling waves: its replica's wave has not started; CommitSync follows.
      c->set_await_commit(!p.commit_sent);
      ++sync->changes;
      spdlog::info(
          "[controller] sync {}: receiver {} [worker {}] registered again; its commit "
          "is decided",
          id, RolesOf(p.roles), p.worker);
    }
  }
}

void SyncCoordinator::SettleDecidedLocked(SyncRecord& sync) {
  const absl::Time now = absl::Now();
  // A receiver that never started copying: listed uncommitted, told to
  // roll back (it keeps the version it served, whole).
  auto roll_back = [&](Participant& p, const std::string& why, const std::string& reason) {
    UncommittedLocked(sync, p, why);
    v1::Assignment a;
    a.mutable_abort()->set_sync_id(sync.status.sync_id());
    a.mutable_abort()->set_reason(reason);
    if (!p.lease_id.empty()) workers_->Push(p.lease_id, std::move(a));
  };
  for (Participant& p : sync.parts) {
    if (p.done) continue;
    if (p.held && !p.lost.empty()) {
      // Held when last heard, then lost (or restored and not registered
      // again): its loss is why it did not commit (it rolls back by its own
      // deadline, held or not: no CommitSync can reach it).
      roll_back(p,
                absl::StrCat(p.lost,
                             "; not registered again by the sync's deadline (its owner held "
                             "syncs off when it was last heard); it keeps the version it served: "
                             "sync this version again (resend=True)"),
                "the sync's deadline passed while this receiver was lost");
      continue;
    }
    if (p.held) {
      // Its owner held syncs off until the deadline (it rolls back by its
      // own deadline too).
      roll_back(p,
                "its owner held syncs off until the sync's deadline (commit_held); it rolls back "
                "and keeps the version it served: sync this version again (resend=True)",
                "the sync's deadline passed while its owner held syncs off");
      continue;
    }
    if (!p.commit_sent) {
      // Its wave never started (rolling waves).
      roll_back(p,
                "its commit wave had not started by the sync's deadline; told to roll back, it "
                "keeps the version it served",
                "the rollout's deadline passed before this replica's wave");
      continue;
    }
    if (p.lost.empty()) {
      // Bound to a live lease, told to commit, silent: it stalled.
      UncommittedLocked(sync, p, "no commit confirmation by the sync's deadline");
    } else if (now >= sync.deadline + p.decision_slack) {
      // It stops waiting for the decision then (and rolls back).
      UncommittedLocked(sync, p,
                        absl::StrCat(p.lost,
                                     "; not registered again by the sync's deadline plus its "
                                     "--decision_slack of ",
                                     absl::FormatDuration(p.decision_slack)));
    }
  }
  MaybeFinishCommitLocked(sync);
}

void SyncCoordinator::TestCrashPointLocked(const SyncRecord& sync, int32_t confirmed) {
  const int32_t n = config_.test_crash_after_commits;
  if (n < 0 || confirmed != n) return;
  spdlog::critical(
      "[controller] --test_crash_after_commits={}: sync {} decided and saved, {} receivers "
      "confirmed; killing this process (test failpoint)",
      n, sync.status.sync_id(), confirmed);
  spdlog::default_logger()->flush();
  raise(SIGKILL);
}

}  // namespace wsync::controller
