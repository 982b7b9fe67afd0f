// SyncCoordinator: reports, completion, aborts, lost workers, deadlines.
#include "controller/server/sync_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/server/report_timings.h"

namespace wsync::controller {

absl::Status SyncCoordinator::CheckBytesLocked(const Participant& p, int64_t bytes_done,
                                               absl::string_view method) {
  if (bytes_done >= 0 && bytes_done <= p.bytes_planned) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      method, ": ", workers_->Describe(p.lease_id), " [worker ", p.worker, "] reports bytes_done ",
      bytes_done, " but the plan writes ", p.bytes_planned, " bytes into it"));
}

absl::Status SyncCoordinator::ReportProgress(const v1::ReportProgressRequest& req) {
  absl::MutexLock lock(&mu_);
  auto it = syncs_.find(req.sync_id());
  if (it == syncs_.end()) {
    return absl::NotFoundError(absl::StrCat("ReportProgress: unknown sync '", req.sync_id(), "'"));
  }
  SyncRecord& sync = *it->second;
  for (Participant& p : sync.parts) {
    if (p.lease_id != req.lease_id()) continue;
    if (absl::Status st = CheckBytesLocked(p, req.bytes_done(), "ReportProgress"); !st.ok()) {
      return st;
    }
    // A staged participant's bytes are final (a late progress report must not
    // make its staged report's repeat look different).
    if (!sync.finished() && !p.done && !p.staged) {
      p.bytes_done = req.bytes_done();
      ++sync.changes;
      cv_.SignalAll();
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "ReportProgress: lease '", req.lease_id(), "' takes no part in sync '", req.sync_id(), "'"));
}

void SyncCoordinator::RecordControlPath(SyncRecord& sync, const Participant& p,
                                        const v1::ReportResultRequest& req) {
  RecordReportTimings(req, sync.start, p.pushed, absl::Now(), sync.status);
}

absl::Status SyncCoordinator::ReportResult(const v1::ReportResultRequest& req) {
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> warm = WarmUpReportLocked(req)) return *warm;  // docs/warm-up.md
  auto it = syncs_.find(req.sync_id());
  if (it == syncs_.end()) {
    return absl::NotFoundError(absl::StrCat("ReportResult: unknown sync '", req.sync_id(), "'"));
  }
  SyncRecord& sync = *it->second;
  for (Participant& p : sync.parts) {
    if (p.lease_id != req.lease_id()) continue;
    if (absl::Status st = CheckBytesLocked(p, req.bytes_done(), "ReportResult"); !st.ok()) {
      return st;
    }
    if (req.direct_writes_unavailable()) workers_->MarkDirectWritesUnavailable(p.lease_id);
    // A worker whose sync failed may have dropped its peer mappings (of this
    // transfer, or all of them): its next assignments carry every list again.
    if (req.code() != 0) workers_->ForgetPeerLists(p.lease_id);
    if (p.done) return absl::OkStatus();
    // A staged report given again (a worker retrying a delivery whose answer
    // it lost): already counted, its verify hashes too.
    if (req.staged() && p.staged && SameStagedReport(p, req)) return absl::OkStatus();
    if (!sync.finished()) KeepVerifyPass(p, req);  // sync_verify.cc
    if (!sync.finished() && StagedReportLocked(sync, p, req)) {
      cv_.SignalAll();
      return absl::OkStatus();
    }
    if (sync.finished()) {
      // Late (after an abort or another worker's failure): the outcome
      // stands, but AwaitWriters learns this worker stopped writing.
      p.done = true;
      // It ran the assignment, so it holds the op list FinishLocked forgot.
      if (req.code() == 0) workers_->MarkPartSent(p.lease_id, p.part_key);
      cv_.SignalAll();
      return absl::OkStatus();
    }
    p.done = true;
    p.bytes_done = req.bytes_done();
    v1::SyncStatus& s = sync.status;
    s.set_workers_done(s.workers_done() + 1);
    RecordControlPath(sync, p, req);
    ++sync.changes;
    if (req.code() != 0) {
      p.code = req.code();
      p.message = req.message();
      p.round = req.round();
      p.op = req.op();
      p.peer = req.peer();
      FailedReportLocked(sync, p);
    } else if (sync.staging.mode() != v1::STAGING_IN_PLACE) {
      MaybeCommitLocked(sync);  // the last sender may complete the first phase
    } else if (s.workers_done() == s.workers_total()) {
      if (sync.first_failure >= 0) {
        SettleLocked(sync);
      } else if (!FinishVerifyLocked(sync)) {
        FinishLocked(sync, v1::SYNC_SUCCEEDED, 0, "", -1, -1, -1, -1);
      }
    }
    cv_.SignalAll();
    return absl::OkStatus();
  }
  if (req.commit_held() || req.commit_admitted()) {
    // Ignored: only a receiver of the sync holds its replica back.
    spdlog::warn("[controller] sync {}: {} report from lease {} ignored: it takes no part in it",
                 req.sync_id(), req.commit_held() ? "commit_held" : "commit_admitted",
                 workers_->Describe(req.lease_id()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "ReportResult: lease '", req.lease_id(), "' takes no part in sync '", req.sync_id(), "'"));
}

namespace {

// Codes of failures that another worker may have caused: a lost connection,
// a peer that went silent, an abort.
bool AboutPeers(int32_t code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

}  // namespace

void SyncCoordinator::FailedReportLocked(SyncRecord& sync, Participant& p) {
  if (sync.first_failure < 0) sync.first_failure = p.worker;
  if (!AboutPeers(p.code)) {
    // Its own failure (bad buffers, a refused version, ...): its cause.
    FinishLocked(sync, v1::SYNC_FAILED, p.code,
                 absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker,
                              "] failed: ", p.message),
                 p.worker, p.round, p.op, p.peer);
    return;
  }
  sync.settle_at = std::min(sync.settle_at, absl::Now() + config_.failure_grace);
  if (config_.failure_grace <= absl::ZeroDuration() ||
      sync.status.workers_done() == sync.status.workers_total()) {
    SettleLocked(sync);
  }
}

std::string SyncCoordinator::FirstReportLocked(const SyncRecord& sync) {
  for (const Participant& p : sync.parts) {
    if (p.worker != sync.first_failure) continue;
    return absl::StrCat("first report: ", workers_->Describe(p.lease_id), " [worker ", p.worker,
                        "] failed: ", p.message);
  }
  return "";
}

void SyncCoordinator::SettleLocked(SyncRecord& sync) {
  if (sync.finished()) return;
  if (sync.status.commit_decided()) {
    SettleDecidedLocked(sync);  // sync_decided.cc
    return;
  }
  const absl::Time now = absl::Now();
  std::vector<std::string> silent;
  const Participant* first_silent = nullptr;
  for (const Participant& p : sync.parts) {
    // A staged receiver that reported staged waits for the decision: it is
    // not the one that stalled.
    if (p.done || p.staged) continue;
    if (first_silent == nullptr) first_silent = &p;
    silent.push_back(absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]"));
  }
  const std::string first = FirstReportLocked(sync);
  if (now >= sync.deadline && first_silent != nullptr) {
    // Every live worker stops at the same deadline and reports what it
    // waited for: the ones that said nothing are the stalled ones.
    FinishLocked(sync, v1::SYNC_FAILED, static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded),
                 absl::StrCat("sync deadline of ", absl::FormatDuration(sync.deadline - sync.start),
                              " exceeded; did not report: ", absl::StrJoin(silent, ", "),
                              first.empty() ? "" : "; ", first),
                 first_silent->worker, -1, -1, -1);
    return;
  }
  for (const Participant& p : sync.parts) {
    if (p.worker != sync.first_failure) continue;
    std::string error = absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker,
                                     "] failed: ", p.message);
    if (!silent.empty())
      absl::StrAppend(&error, " (not reported yet: ", absl::StrJoin(silent, ", "), ")");
    FinishLocked(sync, v1::SYNC_FAILED, p.code, error, p.worker, p.round, p.op, p.peer);
    sync.blamed_reporter = true;
    return;
  }
  if (sync.staging.mode() != v1::STAGING_IN_PLACE) {
    MaybeCommitLocked(sync);  // everyone reported: decided there, never here
    return;
  }
  // Past the deadline, everyone reported and nothing failed: it arrived.
  if (FinishVerifyLocked(sync)) return;
  FinishLocked(sync, v1::SYNC_SUCCEEDED, 0, "", -1, -1, -1, -1);
}

void SyncCoordinator::FinishLocked(SyncRecord& sync, v1::SyncPhase phase, int32_t code,
                                   const std::string& error, int32_t cause_worker, int32_t round,
                                   int32_t op, int32_t peer) {
  if (sync.finished()) return;
  v1::SyncStatus& s = sync.status;
  s.set_phase(phase);
  const absl::Time now = absl::Now();
  s.set_elapsed_seconds(absl::ToDoubleSeconds(now - sync.start));
  s.set_finished_unix_us(absl::ToUnixMicros(now));
  int64_t bytes = 0;
  for (const Participant& p : sync.parts) bytes += p.bytes_done;
  s.set_bytes_done(bytes);
  if (phase != v1::SYNC_SUCCEEDED) {
    // Its workers may drop peer mappings while they unwind, or never see
    // their queued assignment: every list goes again, also to a retry
    // started before their reports arrive.
    for (const Participant& p : sync.parts) workers_->ForgetPeerLists(p.lease_id);
    s.set_error_code(code);
    s.set_error(error);
    s.set_failed_worker(cause_worker);
    s.set_failed_round(round);
    s.set_failed_op(op);
    s.set_failed_peer(peer);
    for (const Participant& p : sync.parts) {
      if (p.worker == cause_worker && !p.roles.empty()) {
        s.set_failed_group(p.roles[0].group());
        s.set_failed_rank(p.roles[0].rank());
      }
    }
  }
  auto tit = transfers_.find(s.transfer());
  if (tit != transfers_.end()) {
    Transfer& t = tit->second;
    if (t.in_flight == s.sync_id()) t.in_flight.clear();
    t.last_sync = s.sync_id();
    if (phase == v1::SYNC_SUCCEEDED) {
      NoteInPlaceSucceededLocked(sync);
      t.last_success_version = std::max(t.last_success_version, s.version());
      if (metrics_ != nullptr) metrics_->SetWeightVersion(t.name, t.last_success_version);
    } else {
      t.generation_broken = true;  // aborted transports must be rebuilt
    }
  }
  if (phase != v1::SYNC_SUCCEEDED) {
    for (const Participant& p : sync.parts) {
      if (p.done) continue;
      // It may drop the assignment unrun (an abort while still queued) and
      // never cache the op list: the next sync with this part sends it again.
      workers_->ForgetPartSent(p.lease_id, p.part_key);
      v1::Assignment a;
      a.mutable_abort()->set_sync_id(s.sync_id());
      a.mutable_abort()->set_reason(error);
      workers_->Push(p.lease_id, std::move(a));  // false: lost, nothing to abort
    }
  }
  const char* outcome = phase == v1::SYNC_SUCCEEDED   ? "succeeded"
                        : phase == v1::SYNC_CANCELLED ? "cancelled"
                                                      : "failed";
  if (metrics_ != nullptr) {
    metrics_->SyncFinished(outcome, s);
  }
  if (phase == v1::SYNC_SUCCEEDED) {
    spdlog::info("[controller] sync {} {} in {:.3f} s", s.sync_id(), outcome, s.elapsed_seconds());
  } else {
    spdlog::warn("[controller] sync {} {} in {:.3f} s: {}", s.sync_id(), outcome,
                 s.elapsed_seconds(), error);
  }
  ++sync.changes;
  // Durable before anyone sees the outcome.
  PersistLocked().IgnoreError();  // logged and counted; the state stays in memory
  cv_.SignalAll();
}

void SyncCoordinator::WorkerLost(const WorkerLoss& loss) {
  absl::MutexLock lock(&mu_);
  // Every running sync this worker takes part in fails, naming it; a sync
  // that already failed because a peer lost its connection to this worker
  // names it as its cause from now on.
  for (auto& [id, sync] : syncs_) {
    for (Participant& p : sync->parts) {
      if (p.lease_id != loss.lease_id) continue;
      if (!sync->finished() && sync->status.commit_decided()) {
        // Decided: the others commit. This one may register again before
        // the deadline plus its --decision_slack (it waits that long for the
        // decision) and hear it then (Rejoin); else it is listed
        // uncommitted (SettleDecidedLocked) and serves nothing until it
        // syncs this version again (docs/staging.md).
        if (!p.done && p.stages) {
          p.lost = absl::StrCat("lost: ", loss.reason);
          p.lost_since = absl::Now();
          ++sync->changes;
        } else if (!p.done) {
          UncommittedLocked(*sync, p, absl::StrCat("lost: ", loss.reason));
        }
        MaybeFinishCommitLocked(*sync);
        break;
      }
      if (!sync->finished()) {
        const std::string first = FirstReportLocked(*sync);
        FinishLocked(*sync, v1::SYNC_FAILED, static_cast<int32_t>(absl::StatusCode::kUnavailable),
                     absl::StrCat(loss.description, " [worker ", p.worker, "] lost: ", loss.reason,
                                  first.empty() ? "" : "; ", first),
                     p.worker, -1, -1, -1);
      } else {
        BlameLostPeerLocked(*sync, p, loss);
      }
      break;
    }
  }
  WarmUpLostLocked(loss);
  cv_.SignalAll();
}

void SyncCoordinator::BlameLostPeerLocked(SyncRecord& sync, const Participant& lost,
                                          const WorkerLoss& loss) {
  v1::SyncStatus& s = sync.status;
  // Only a failure another worker reported about this one as its peer, or
  // one reported about peers by a worker blamed for want of a better cause
  // when this one had not reported; and only while the loss can still
  // explain it (a silent worker is declared lost within one lease TTL).
  const absl::Time ended = sync.start + absl::Seconds(s.elapsed_seconds());
  if (s.phase() != v1::SYNC_FAILED ||
      (s.failed_peer() != lost.worker && !(sync.blamed_reporter && !lost.done)) ||
      s.failed_worker() == lost.worker || lost.roles.empty() ||
      absl::Now() - ended > 2 * config_.lease_ttl) {
    return;
  }
  s.set_error(absl::StrCat(loss.description, " [worker ", lost.worker, "] was lost (", loss.reason,
                           "), the likely cause; first report: ", s.error()));
  s.set_failed_worker(lost.worker);
  s.set_failed_group(lost.roles[0].group());
  s.set_failed_rank(lost.roles[0].rank());
  sync.blamed_reporter = false;
  ++sync.changes;
  PersistLocked().IgnoreError();  // logged and counted; the state stays in memory
}

void SyncCoordinator::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (auto& [id, sync] : syncs_) {
    if (sync->finished()) continue;
    if (sync->status.commit_decided() && !sync->replicas.empty()) {
      AdvanceRolloutLocked(*sync);  // a lost receiver's hold may have ended
      RefreshRolloutLocked(*sync);
    }
    // Past its deadline a sync waits up to failure_grace for the workers'
    // own deadline reports (which name whom they waited for).
    if (now >= sync->settle_at || now >= sync->deadline + config_.failure_grace) {
      SettleLocked(*sync);
    }
  }
  while (sync_order_.size() > 256) {
    auto it = syncs_.find(sync_order_.front());
    if (it != syncs_.end() && !it->second->finished()) break;
    if (it != syncs_.end()) syncs_.erase(it);
    sync_order_.pop_front();
  }
}

void SyncCoordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  cv_.SignalAll();
}

}  // namespace wsync::controller
