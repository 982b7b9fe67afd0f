// WorkerAgent: the receiver's half of a staged sync's two phases
// (docs/staging.md).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/agent/agent.h"

namespace wsync::agent {

int64_t WorkerAgent::Applied(const std::string& transfer) {
  absl::MutexLock lock(&mu_);
  auto it = applied_.find(transfer);
  return it == applied_.end() ? 0 : it->second;
}

v1::ReportResultRequest WorkerAgent::DecidedReport(const std::string& sync_id) {
  v1::ReportResultRequest done;
  done.set_sync_id(sync_id);
  done.set_round(-1);
  done.set_op(-1);
  done.set_peer(-1);
  return done;
}

void WorkerAgent::RejoinStaged(const v1::RegisterWorkerResponse& resp, uint64_t lease_epoch) {
  std::vector<std::string> ids, later;
  for (const v1::DecidedCommit& c : resp.decided_commits()) {
    ids.push_back(c.sync_id());
    if (c.await_commit()) later.push_back(c.sync_id());
  }
  const std::vector<StagedGate::Held> held = gate_.Rejoined(
      lease_epoch, ids,
      absl::StrCat("registered again with controller instance ", resp.controller_instance(),
                   ", which has no commit decision for it"),
      later);
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::DecidedCommit& c = resp.decided_commits(static_cast<int>(i));
    v1::ReportResultRequest r = DecidedReport(c.sync_id());
    switch (held[i]) {
      case StagedGate::Held::kAwaiting:
        spdlog::info(
            "[worker {}] sync {}: the commit of version {} was decided before the "
            "controller restarted; committing it",
            c.transfer(), c.sync_id(), c.version());
        continue;  // StepStaged commits and reports
      case StagedGate::Held::kCommitting: {
        // Held by its owner: commit_held said again on this lease (the first
        // report may have been lost, or the controller restarted since), by
        // the exec thread, which orders it with an admission.
        absl::MutexLock lock(&mu_);
        if (held_sync_ == c.sync_id()) {
          held_report_due_ = true;
          ++gate_wakes_;  // wakes the exec thread
        }
        continue;  // else StepStaged reports on this lease
      }
      case StagedGate::Held::kWaiting:
        spdlog::info(
            "[worker {}] sync {}: the commit of version {} is decided; its wave has not "
            "started, keeping the shadow until CommitSync",
            c.transfer(), c.sync_id(), c.version());
        // Not held (a held one is committing here, kCommitting): a
        // controller that saved it held learns it awaits a wave again.
        r.set_commit_admitted(true);
        break;  // CommitSync arrives on the new stream
      case StagedGate::Held::kCommitted:
        r.set_committed(true);
        break;
      case StagedGate::Held::kNothing:
        spdlog::warn(
            "[worker {}] sync {}: decided, but this worker holds no shadow of version "
            "{}; it serves nothing of it until it syncs version {} again",
            c.transfer(), c.sync_id(), c.version(), c.version());
        r.set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
        r.set_message(absl::StrCat(
            "holds no staged shadow of version ", c.version(), " of '", c.transfer(),
            "' (rolled back at its deadline, or restarted, before the controller's word); "
            "it must sync version ",
            c.version(), " again"));
        break;
    }
    Report(std::move(r), resp.lease_id(), /*patience=*/absl::ZeroDuration());  // registering
  }
}

absl::Time WorkerAgent::PendingDeadline(const PendingCommit& p) const {
  const absl::Time deadline = absl::FromUnixMillis(p.q.assignment.deadline_unix_ms());
  return p.phase == PendingCommit::kAdmission ? deadline : deadline + options_.decision_slack;
}

void WorkerAgent::BeginStaged(const Queued& q, v1::ReportResultRequest r) {
  const v1::SyncAssignment& a = q.assignment;
  pending_.emplace(PendingCommit{});
  pending_->q = q;
  pending_->before = Applied(a.transfer());
  v1::SyncEvent staged = EventOf(a, v1::SyncEvent::STAGED);
  staged.set_serving_version(pending_->before);
  // Read by every owner before the controller counts this rank staged: an
  // owner whose worker dies after it serves nothing until its next
  // COMMITTED (docs/staging.md, "The owner's view"); one that did not read
  // it in time fails the sync, so the pool never commits without it.
  if (absl::Status read = PublishRead(staged); !read.ok()) {
    r.clear_staged();
    r.clear_checksums();
    r.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
    r.set_message(absl::StrCat("staged, but not reported staged: ", read.message()));
    r.set_round(-1);
    r.set_op(-1);
    r.set_peer(-1);
    Report(std::move(r), q.lease_id);
    return RollBackPending(std::string(read.message()), /*report=*/false);
  }
  // Armed before the report: a controller that decides after hearing it and
  // dies finds this sync armed when this worker registers again. A
  // registration after `lease_epoch` decides it, heard before or after this
  // (staged_gate.h).
  gate_.Arm(a.sync_id(), q.lease_epoch);
  Report(std::move(r), q.lease_id);
}

void WorkerAgent::StepStaged() {
  PendingCommit& p = *pending_;
  const v1::SyncAssignment& a = p.q.assignment;
  if (p.phase == PendingCommit::kDecision) {
    std::optional<StagedGate::Decision> d = gate_.Poll(PendingDeadline(p));
    if (!d.has_value()) return;  // still waiting for its wave
    if (!d->commit) return RollBackPending(d->reason);
    if (stop_.load()) {
      gate_.Finished(a.sync_id(), /*committed=*/false);
      return RollBackPending("the worker is stopping");
    }
    // The hold is read in the critical section that begins the commit: a
    // hold set after it waits for the commit to end (CommitLatch).
    const std::string held = latch_.TryBegin(a.sync_id());
    if (held.empty()) return CommitPending();
    // Decided, but the owner holds syncs off (its memory must not be
    // written now): tell the controller at once, so that its replica
    // holds no wave back, and wait for the owner until the deadline.
    spdlog::info("[worker {}] sync {}: commit decided, its owner holds syncs off ({}); waiting",
                 a.transfer(), a.sync_id(), held);
    p.phase = PendingCommit::kAdmission;
    p.held = held;
    {
      absl::MutexLock lock(&mu_);
      held_sync_ = a.sync_id();
    }
    return ReportHeld(p);
  }
  const std::string held = latch_.held();
  uint64_t epoch = 0;
  absl::Duration every;
  bool due = false;
  {
    absl::MutexLock lock(&mu_);
    epoch = lease_epoch_;
    every = heartbeat_interval_;
    due = held_report_due_;
    held_report_due_ = false;
    if (held.empty() || stop_.load()) held_sync_.clear();
  }
  if (stop_.load()) {
    gate_.Finished(a.sync_id(), /*committed=*/false);
    return RollBackPending("the worker is stopping");
  }
  if (held.empty()) {
    // Admitted before the deadline: the commit still stands; the controller
    // sends CommitSync again when a wave has room (max_unavailable). A
    // CommitSync heard while held is dropped (keep_early_commit false): the
    // controller sends a new one when every rank of the replica is admitted.
    gate_.Finished(a.sync_id(), /*committed=*/false);
    gate_.Arm(a.sync_id(), epoch, /*keep_early_commit=*/false);
    p.phase = PendingCommit::kDecision;
    v1::ReportResultRequest r = DecidedReport(a.sync_id());
    r.set_commit_admitted(true);
    ReportOnLease(std::move(r), p.q.lease_id);
    return;
  }
  if (absl::Now() < PendingDeadline(p)) {
    // A report is sent once and may be lost: repeated every heartbeat
    // interval while held and after a registration (RejoinStaged); the
    // controller ignores a repeat.
    if (due || absl::Now() >= p.held_reported + every) ReportHeld(p);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    held_sync_.clear();
  }
  // Still held at the deadline: the live tensors stay untouched on the old
  // version and the controller lists it uncommitted.
  gate_.Finished(a.sync_id(), /*committed=*/false);
  RollBackPending(absl::StrCat("its owner held syncs off (", p.held,
                               ") until the sync's deadline; it must sync version ", a.version(),
                               " again"));
}

void WorkerAgent::ReportHeld(PendingCommit& p) {
  p.held_reported = absl::Now();
  if (options_.test_drop_held_reports > held_reports_dropped_) {
    ++held_reports_dropped_;  // test only (--test_drop_held_reports)
    spdlog::warn("[worker {}] sync {}: commit_held report dropped (test failpoint)",
                 p.q.assignment.transfer(), p.q.assignment.sync_id());
    return;
  }
  v1::ReportResultRequest r = DecidedReport(p.q.assignment.sync_id());
  r.set_commit_held(true);
  ReportOnLease(std::move(r), p.q.lease_id);
}

void WorkerAgent::ReportOnLease(v1::ReportResultRequest r, const std::string& lease_id) {
  // After a restart the decision came through a new lease: report there.
  const std::string now = lease();
  Report(std::move(r), now.empty() ? lease_id : now);
}

void WorkerAgent::RollBackPending(const std::string& reason, bool report) {
  const PendingCommit p = std::move(*pending_);
  pending_.reset();
  const v1::SyncAssignment& a = p.q.assignment;
  runner_.DiscardStaged();
  spdlog::warn("[worker {}] sync {} rolled back (live tensors stay on version {}): {}",
               a.transfer(), a.sync_id(), p.before, reason);
  v1::SyncEvent rolled = EventOf(a, v1::SyncEvent::ROLLED_BACK);
  rolled.set_serving_version(p.before);
  rolled.set_error(reason);
  Publish(rolled);
  if (report) {
    v1::ReportResultRequest done = DecidedReport(a.sync_id());
    done.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
    done.set_message(
        absl::StrCat("rolled back, the live tensors kept version ", p.before, ": ", reason));
    ReportOnLease(std::move(done), p.q.lease_id);
  }
  PublishEnd(a, /*ok=*/false, absl::StrCat("rolled back: ", reason), /*untouched=*/true);
}

void WorkerAgent::CommitPending() {
  const PendingCommit p = std::move(*pending_);
  pending_.reset();
  const v1::SyncAssignment& a = p.q.assignment;
  v1::ReportResultRequest done = DecidedReport(a.sync_id());
  v1::SyncEvent commit = EventOf(a, v1::SyncEvent::COMMIT);
  commit.set_serving_version(p.before);
  Publish(commit);
  absl::SleepFor(options_.test_commit_delay);  // test only (0 unless the failpoint is set)
  const absl::Time t = absl::Now();
  const std::string kind = runner_.commit_kind();
  const absl::Status s = runner_.CommitStaged(a.sync_id());
  done.set_commit_seconds(absl::ToDoubleSeconds(absl::Now() - t));
  done.set_commit_kind(kind);
  if (!s.ok()) {
    // Decided pool-wide, failed here: the live tensors are partly written.
    gate_.Finished(a.sync_id(), /*committed=*/false);
    spdlog::error("[worker {}] sync {}: commit failed: {}", a.transfer(), a.sync_id(),
                  std::string(s.message()));
    done.set_code(static_cast<int32_t>(s.code()));
    // A copy commit stops midway; a swap or flip commit that fails leaves
    // the live tensors on the version they held (its message says so).
    const bool copy = kind == std::string("copy");
    done.set_message(absl::StrCat(
        copy ? "commit failed, the live tensors are partly written: " : "commit failed: ",
        s.message()));
    ReportOnLease(std::move(done), p.q.lease_id);
    PublishEnd(a, /*ok=*/false, absl::StrCat("commit failed: ", s.message()),
               /*untouched=*/!copy && kind != std::string("swap"));
    latch_.End();  // after FINISHED: a hold that waited sees the outcome published
    return;
  }
  {
    // Before the report: whoever learns of the commit sees this version.
    absl::MutexLock lock(&mu_);
    last_version_ = std::max(last_version_, a.version());
    int64_t& applied = applied_[a.transfer()];
    applied = std::max(applied, a.version());
  }
  if (a.staging().verify()) {
    // Verify mode: what the live tensors now hold, for the controller to
    // compare with the senders' sources. A failed pass sends no hashes: the
    // controller fails the sync naming the buckets left unverified.
    if (absl::Status v = runner_.VerifyCommitted(a, &done); !v.ok()) {
      spdlog::error("[worker {}] sync {}: verify pass after the commit failed: {}", a.transfer(),
                    a.sync_id(), std::string(v.message()));
    }
  }
  // Before reading the lease: a registration after it confirms again.
  gate_.Finished(a.sync_id(), /*committed=*/true);
  v1::SyncEvent committed = EventOf(a, v1::SyncEvent::COMMITTED);
  committed.set_serving_version(a.version());
  committed.set_commit_kind(kind);
  committed.set_commit_seconds(done.commit_seconds());
  committed.set_flipped_onto(runner_.flipped_onto());
  Publish(committed);
  done.set_committed(true);
  ReportOnLease(std::move(done), p.q.lease_id);
  PublishEnd(a, /*ok=*/true, "", /*untouched=*/false);
  latch_.End();  // after FINISHED: a hold that waited sees the outcome published
  // The pause is over: the swap's other half now, not in the next sync.
  if (absl::Status f = runner_.FinishStagedSwap(); !f.ok()) {
    spdlog::warn("[worker {}] sync {}: {}; the next staged sync makes a new twin", a.transfer(),
                 a.sync_id(), std::string(f.message()));
  }
}

}  // namespace wsync::agent
