// SyncCoordinator: rolling waves (docs/staging-rollout.md, "Rolling waves"). Once a
// staged sync's commit is decided, its receivers are grouped into replicas
// (one model copy each: they commit together) and CommitSync goes out wave
// by wave: at most rollout.max_unavailable replicas committing at once, the
// next wave once every replica of the previous one confirmed or was listed
// uncommitted. Each wave is saved (DecidedParticipant.commit_sent) before it
// is sent, so that a restarted controller resumes the remaining waves
// (sync_decided.cc). The controller's view of what each destination rank
// serves (the version it confirmed last) feeds GetStatus, ListWorkers, a
// metric and the max_staleness check.
#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

int32_t SyncCoordinator::DestinationRankLocked(const SyncRecord& sync, const Participant& p) {
  auto t = transfers_.find(sync.status.transfer());
  if (t == transfers_.end()) return -1;
  for (const v1::Membership& m : p.roles) {
    if (m.group() == t->second.destination_group) return m.rank();
  }
  return -1;
}

void SyncCoordinator::GroupReplicasLocked(SyncRecord& sync) {
  auto t = transfers_.find(sync.status.transfer());
  const std::string group = t == transfers_.end() ? "" : t->second.destination_group;
  std::vector<RolloutMember> members;
  for (size_t i = 0; i < sync.parts.size(); ++i) {
    const Participant& p = sync.parts[i];
    if (!p.staged) continue;
    RolloutMember m;
    m.part = i;
    m.rank = DestinationRankLocked(sync, p);
    if (labeler_ && m.rank >= 0 && sync.rollout.replica_ranks() == 0) {
      m.label = labeler_(group, m.rank, p.lease_id);
    }
    members.push_back(std::move(m));
  }
  sync.replicas = GroupReplicas(members, sync.rollout.replica_ranks());
  for (size_t r = 0; r < sync.replicas.size(); ++r) {
    for (size_t part : sync.replicas[r].parts) {
      sync.parts[part].replica = static_cast<int32_t>(r);
    }
  }
  sync.next_wave = 0;
}

std::vector<ReplicaPhase> SyncCoordinator::PhasesLocked(const SyncRecord& sync) {
  std::vector<ReplicaPhase> phases;
  for (const RolloutReplica& r : sync.replicas) {
    bool committing = false, waiting = false, held = false;
    for (size_t part : r.parts) {
      const Participant& p = sync.parts[part];
      if (p.done) continue;
      // Its owner holds syncs off (commit_held): not committing, so it holds
      // no wave back; it waits for a wave again once admitted. A replica
      // waits for a wave only once every rank of it is admitted: a rank
      // still held keeps the whole replica held (its siblings admitted
      // before it wait with it, and no CommitSync reaches a held rank).
      if (p.held) {
        held = true;
        continue;
      }
      // A receiver lost after its CommitSync went out (its lease ended, or
      // the controller restarted) may be committing still: it holds the
      // next waves back for one lease TTL, then no more (it may still
      // register again and commit until the deadline plus its
      // --decision_slack, Rejoin).
      if (!p.commit_sent) {
        waiting = true;
      } else if (p.lost.empty() || absl::Now() < p.lost_since + config_.lease_ttl) {
        committing = true;
      }
    }
    phases.push_back(committing ? ReplicaPhase::kCommitting
                     : held     ? ReplicaPhase::kHeld
                     : waiting  ? ReplicaPhase::kWaiting
                                : ReplicaPhase::kDone);
  }
  return phases;
}

std::vector<size_t> SyncCoordinator::MarkNextWaveLocked(SyncRecord& sync) {
  std::vector<size_t> parts;
  const std::vector<size_t> wave = NextWave(PhasesLocked(sync), sync.rollout.max_unavailable());
  if (wave.empty()) return parts;
  const int32_t number = sync.next_wave++;
  for (size_t r : wave) {
    sync.replicas[r].wave = number;
    for (size_t part : sync.replicas[r].parts) {
      Participant& p = sync.parts[part];
      if (p.done || p.held) continue;  // a held rank is never in a wave (PhasesLocked)
      p.commit_sent = true;
      parts.push_back(part);
    }
  }
  ++sync.changes;
  return parts;
}

void SyncCoordinator::PushCommitsLocked(SyncRecord& sync, const std::vector<size_t>& parts) {
  // Test only: the first N receivers hear it, then the process dies.
  const int32_t crash_after = config_.test_crash_after_commits;
  for (size_t part : parts) {
    if (crash_after >= 0 && sync.commits_pushed >= crash_after) return;
    v1::Assignment a;
    a.mutable_commit()->set_sync_id(sync.status.sync_id());
    // A lost receiver: WorkerLost lists it uncommitted. One without a lease
    // (restored, not registered again) hears it at registration (Rejoin).
    if (!sync.parts[part].lease_id.empty()) workers_->Push(sync.parts[part].lease_id, std::move(a));
    ++sync.commits_pushed;
  }
}

void SyncCoordinator::AdvanceRolloutLocked(SyncRecord& sync) {
  // No wave starts past the deadline: the replicas still waiting stay on the
  // old version (SettleDecidedLocked rolls them back).
  if (sync.finished() || !sync.status.commit_decided() || absl::Now() >= sync.deadline) return;
  // A wave whose receivers were all lost already holds nothing back: the
  // next one starts at once (at most one wave per replica).
  for (size_t n = 0; n <= sync.replicas.size(); ++n) {
    const std::vector<ReplicaPhase> phases = PhasesLocked(sync);
    if (std::count(phases.begin(), phases.end(), ReplicaPhase::kCommitting) > 0 && n > 0) return;
    if (!PushNextWaveLocked(sync)) return;
  }
}

bool SyncCoordinator::PushNextWaveLocked(SyncRecord& sync) {
  const std::vector<size_t> parts = MarkNextWaveLocked(sync);
  if (parts.empty()) return false;
  // Saved before it is sent: a restarted controller must not start a wave
  // beside one already committing. The decision stands either way: a failed
  // save is logged (PersistLocked) and the wave goes out.
  if (absl::Status saved = PersistLocked(); !saved.ok()) {
    spdlog::error("[controller] sync {}: wave {} could not be saved ({}); sending it anyway",
                  sync.status.sync_id(), sync.next_wave - 1, std::string(saved.message()));
  }
  spdlog::info("[controller] sync {}: commit wave {} to {} receivers", sync.status.sync_id(),
               sync.next_wave - 1, parts.size());
  PushCommitsLocked(sync, parts);
  return true;
}

void SyncCoordinator::HeldReportLocked(SyncRecord& sync, Participant& p,
                                       const v1::ReportResultRequest& req) {
  // Held: no longer committing (it does not pause), so the next wave may
  // start. Admitted: it awaits a new CommitSync, which the next wave with
  // room sends (max_unavailable stays a bound on the replicas pausing).
  // An admission of one not held (a worker that registered again while it
  // awaited its wave says so) changes nothing: its wave may have started.
  if (!req.commit_held() && !p.held) return;
  // A repeat (the worker says it again every heartbeat interval and at
  // registration, a lost report being otherwise final) changes nothing.
  if (req.commit_held() && p.held) return;
  p.held = req.commit_held();
  p.commit_sent = false;
  ++sync.changes;
  // Saved at once: a restarted controller must not count a held replica as
  // committing (it would hold every later wave and ignore its admission).
  if (absl::Status saved = PersistLocked(); !saved.ok()) {
    spdlog::error("[controller] sync {}: receiver [worker {}] {} could not be saved ({})",
                  sync.status.sync_id(), p.worker, p.held ? "held" : "admitted",
                  std::string(saved.message()));
  }
  spdlog::info("[controller] sync {}: receiver {} [worker {}] {}", sync.status.sync_id(),
               workers_->Describe(p.lease_id), p.worker,
               p.held ? "is held by its owner: its replica waits, the next wave may start"
                      : "was admitted by its owner: its replica waits for a wave");
  MaybeFinishCommitLocked(sync);
}

void SyncCoordinator::RefreshRolloutLocked(SyncRecord& sync) {
  if (sync.replicas.empty()) return;
  v1::RolloutProgress* out = sync.status.mutable_rollout();
  const std::vector<ReplicaPhase> phases = PhasesLocked(sync);
  out->set_max_unavailable(sync.rollout.max_unavailable());
  std::map<int32_t, bool> wave_done;  // wave -> every replica of it done
  int32_t committing = 0;
  out->clear_replicas();
  for (size_t r = 0; r < sync.replicas.size(); ++r) {
    const RolloutReplica& rep = sync.replicas[r];
    v1::ReplicaVersion* v = out->add_replicas();
    v->set_replica(rep.label);
    for (int32_t rank : rep.ranks) v->add_ranks(rank);
    v->set_wave(rep.wave);
    bool all_committed = true;
    for (size_t part : rep.parts) all_committed &= sync.parts[part].committed;
    if (phases[r] == ReplicaPhase::kWaiting) {
      v->set_state("waiting");
    } else if (phases[r] == ReplicaPhase::kCommitting) {
      v->set_state("committing");
      ++committing;
    } else if (phases[r] == ReplicaPhase::kHeld) {
      v->set_state("held");
    } else {
      v->set_state(all_committed ? "committed" : "uncommitted");
    }
    if (phases[r] == ReplicaPhase::kDone && all_committed) v->set_version(sync.status.version());
    if (rep.wave >= 0) {
      bool& all_done = wave_done.emplace(rep.wave, true).first->second;
      all_done = all_done && phases[r] == ReplicaPhase::kDone;
    }
  }
  int32_t done = 0;
  for (const auto& [wave, all] : wave_done) done += all ? 1 : 0;
  out->set_committing(committing);
  out->set_waves_done(done);
  out->set_waves_total(done + WavesLeft(phases, sync.rollout.max_unavailable()));
}

void SyncCoordinator::NoteServedLocked(const SyncRecord& sync, const Participant& p, bool committed,
                                       bool export_metric) {
  auto t = transfers_.find(sync.status.transfer());
  const int32_t rank = DestinationRankLocked(sync, p);
  if (t == transfers_.end() || rank < 0) return;
  Transfer::ServedRank& served = t->second.served[rank];
  if (p.replica >= 0 && p.replica < static_cast<int32_t>(sync.replicas.size())) {
    served.replica = sync.replicas[p.replica].label;
  }
  if (!committed) {
    served.uncommitted = true;
  } else {
    served.version = std::max(served.version, sync.status.version());
    served.uncommitted = false;
    std::optional<WorkerSnapshot> w = workers_->Find(p.lease_id);
    served.instance = w.has_value() ? w->info->instance_id() : "";
  }
  if (export_metric) ExportServedLocked(t->second);
}

void SyncCoordinator::ExportServedLocked(const Transfer& t) {
  if (metrics_ == nullptr) return;
  for (const v1::ReplicaVersion& r : ServedReplicasLocked(t)) {
    metrics_->SetCommittedVersion(t.name, r.replica(), static_cast<double>(r.version()));
  }
}

void SyncCoordinator::NoteInPlaceSucceededLocked(const SyncRecord& sync) {
  if (sync.staging.mode() != v1::STAGING_IN_PLACE) return;
  for (const Participant& p : sync.parts) {
    if (DestinationRankLocked(sync, p) >= 0) NoteServedLocked(sync, p, true, false);
  }
  auto t = transfers_.find(sync.status.transfer());
  if (t != transfers_.end()) ExportServedLocked(t->second);
}

std::vector<v1::ReplicaVersion> SyncCoordinator::ServedReplicasLocked(const Transfer& t) {
  std::map<std::string, v1::ReplicaVersion> by_label;
  std::map<std::string, std::vector<int64_t>> versions;
  for (const auto& [rank, s] : t.served) {
    v1::ReplicaVersion& r = by_label[s.replica];
    r.set_replica(s.replica);
    r.add_ranks(rank);
    r.set_wave(-1);
    if (s.uncommitted) r.set_state("uncommitted");
    versions[s.replica].push_back(s.version);
  }
  std::vector<v1::ReplicaVersion> out;
  for (auto& [label, r] : by_label) {
    const std::vector<int64_t>& v = versions[label];
    // Its ranks disagree: a rank did not confirm, its version is the older.
    r.set_version(*std::min_element(v.begin(), v.end()));
    if (r.state().empty()) {
      r.set_state(*std::max_element(v.begin(), v.end()) == r.version() ? "serving" : "uncommitted");
    }
    out.push_back(std::move(r));
  }
  return out;
}

void SyncCoordinator::AddServingVersions(v1::ListWorkersResponse* resp) {
  absl::MutexLock lock(&mu_);
  for (v1::RegisteredWorker& w : *resp->mutable_workers()) {
    for (const v1::Membership& m : w.memberships()) {
      for (const auto& [name, t] : transfers_) {
        if (t.destination_group != m.group()) continue;
        auto s = t.served.find(m.rank());
        // Only what this worker itself committed: a restarted one serves
        // nothing its predecessor committed.
        if (s == t.served.end() || s->second.instance != w.instance_id()) continue;
        v1::RankVersion* v = w.add_serving_versions();
        v->set_group(m.group());
        v->set_rank(m.rank());
        v->set_transfer(name);
        v->set_version(s->second.uncommitted ? 0 : s->second.version);
        v->set_replica(s->second.replica);
      }
    }
  }
}

}  // namespace wsync::controller
