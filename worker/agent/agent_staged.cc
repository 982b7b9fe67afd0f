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
        continue;  // FinishStaged commits and reports
      case StagedGate::Held::kCommitting:
        continue;  // FinishStaged reports on this lease
      case StagedGate::Held::kWaiting:
        spdlog::info(
            "[worker {}] sync {}: the commit of version {} is decided; its wave has not "
            "started, keeping the shadow until CommitSync",
            c.transfer(), c.sync_id(), c.version());
        continue;  // CommitSync arrives on the new stream
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
    Report(std::move(r), resp.lease_id());
  }
}

bool WorkerAgent::AwaitAdmitted(const v1::SyncAssignment& a, std::string* held) {
  absl::MutexLock lock(&mu_);
  auto admitted = [this]()
                      ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_.empty() || stop_.load(); };
  if (!held_.empty()) {
    spdlog::info("[worker {}] sync {}: commit decided, waiting for the owner to admit syncs ({})",
                 a.transfer(), a.sync_id(), held_);
  }
  mu_.AwaitWithDeadline(absl::Condition(&admitted), absl::FromUnixMillis(a.deadline_unix_ms()));
  *held = held_;
  return held_.empty() && !stop_.load();
}

void WorkerAgent::FinishStaged(const v1::SyncAssignment& a, const std::string& lease_id,
                               uint64_t lease_epoch, v1::ReportResultRequest r) {
  const int64_t before = Applied(a.transfer());
  v1::SyncEvent staged = EventOf(a, v1::SyncEvent::STAGED);
  staged.set_serving_version(before);
  Publish(staged);
  // Armed before the report: a controller that decides after hearing it and
  // dies finds this sync armed when this worker registers again. A
  // registration after `lease_epoch` decides it, heard before or after this
  // (staged_gate.h).
  gate_.Arm(a.sync_id(), lease_epoch);
  Report(std::move(r), lease_id);
  StagedGate::Decision d =
      gate_.Wait(absl::FromUnixMillis(a.deadline_unix_ms()) + options_.decision_slack);
  std::string held;
  if (d.commit && !AwaitAdmitted(a, &held)) {
    // Decided pool-wide, but the owner holds syncs off (its memory must not
    // be written now) past the deadline: the live tensors stay untouched on
    // the old version and the controller lists it uncommitted.
    gate_.Finished(a.sync_id(), /*committed=*/false);
    // A worker stopped while held says so: its end is not the owner's hold.
    const bool stopping = held.empty() || stop_.load();
    d = StagedGate::Decision{
        false, stopping ? std::string("the worker is stopping")
                        : absl::StrCat("its owner held syncs off (", held,
                                       ") until the sync's deadline; it must sync version ",
                                       a.version(), " again")};
  }
  // After a restart the decision came through a new lease: report there.
  auto report = [&](v1::ReportResultRequest done) {
    const std::string now = lease();
    Report(std::move(done), now.empty() ? lease_id : now);
  };
  v1::ReportResultRequest done = DecidedReport(a.sync_id());
  if (!d.commit) {
    runner_.DiscardStaged();
    spdlog::warn("[worker {}] sync {} rolled back (live tensors stay on version {}): {}",
                 a.transfer(), a.sync_id(), before, d.reason);
    v1::SyncEvent rolled = EventOf(a, v1::SyncEvent::ROLLED_BACK);
    rolled.set_serving_version(before);
    rolled.set_error(d.reason);
    Publish(rolled);
    done.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
    done.set_message(
        absl::StrCat("rolled back, the live tensors kept version ", before, ": ", d.reason));
    report(std::move(done));
    PublishEnd(a, /*ok=*/false, absl::StrCat("rolled back: ", d.reason), /*untouched=*/true);
    return;
  }
  v1::SyncEvent commit = EventOf(a, v1::SyncEvent::COMMIT);
  commit.set_serving_version(before);
  Publish(commit);
  const absl::Time t = absl::Now();
  const absl::Status s = runner_.CommitStaged();
  done.set_commit_seconds(absl::ToDoubleSeconds(absl::Now() - t));
  if (!s.ok()) {
    // Decided pool-wide, failed here: the live tensors are partly written.
    gate_.Finished(a.sync_id(), /*committed=*/false);
    spdlog::error("[worker {}] sync {}: commit failed: {}", a.transfer(), a.sync_id(),
                  std::string(s.message()));
    done.set_code(static_cast<int32_t>(s.code()));
    done.set_message(
        absl::StrCat("commit failed, the live tensors are partly written: ", s.message()));
    report(std::move(done));
    PublishEnd(a, /*ok=*/false, absl::StrCat("commit failed: ", s.message()),
               /*untouched=*/false);
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
  Publish(committed);
  done.set_committed(true);
  report(std::move(done));
  PublishEnd(a, /*ok=*/true, "", /*untouched=*/false);
}

}  // namespace wsync::agent
