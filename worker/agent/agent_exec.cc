// WorkerAgent: the exec thread. Runs the queued assignments one at a time
// (syncs and warm-ups) and steps the staged sync whose commit is pending
// (agent_staged.cc). A pending commit does not block the thread: while a
// receiver waits for its commit wave (or its owner's admission), the thread
// runs warm-ups of other transfers (they write no tensor and no shadow,
// SyncRunner::commit_pending); every sync waits behind the commit, in queue
// order, since it may write the tensors the commit copies into.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/agent/agent.h"

namespace wsync::agent {

int WorkerAgent::NextRunnableLocked(const std::string& pending_transfer) const {
  if (pending_transfer.empty()) return queue_.empty() ? -1 : 0;
  for (size_t i = 0; i < queue_.size(); ++i) {
    const v1::SyncAssignment& a = queue_[i].assignment;
    if (a.warm_up() && a.transfer() != pending_transfer) return static_cast<int>(i);
  }
  return -1;
}

template <typename Ready>
void WorkerAgent::SpinFor(const Ready& ready, absl::Time until) {
  while (busy_.Spinning() && !stop_.load() && absl::Now() < until) {
    {
      absl::MutexLock lock(&mu_);
      if (ready()) return;
    }
    BusyPoll::Relax();
  }
}

void WorkerAgent::ExecLoop() {
  uint64_t epoch_seen = 0;
  int64_t wakes_seen = 0;
  while (!stop_.load()) {
    Queued q;
    std::vector<Queued> dropped;
    // Fixed while the thread waits (only this thread changes pending_).
    const std::string pending_transfer = pending_ ? pending_->q.assignment.transfer() : "";
    absl::Time until = absl::Now() + absl::Milliseconds(100);
    if (pending_) until = std::min(until, PendingDeadline(*pending_));
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !dropped_.empty() || NextRunnableLocked(pending_transfer) >= 0 ||
             (!pending_transfer.empty() && gate_wakes_ != wakes_seen);
    };
    SpinFor(ready, until);  // the low-latency mode; no-op when off
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&ready), until);
      wakes_seen = gate_wakes_;
      dropped.swap(dropped_);
      if (const int i = NextRunnableLocked(pending_transfer); i >= 0) {
        q = std::move(queue_[i]);
        queue_.erase(queue_.begin() + i);
      }
    }
    for (const Queued& d : dropped) {
      runner_.CachePlan(d.assignment);
      v1::ReportResultRequest r;
      r.set_sync_id(d.assignment.sync_id());
      r.set_warm_up(d.assignment.warm_up());
      r.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
      r.set_message("aborted while queued: never ran, nothing written");
      r.set_round(-1);
      r.set_op(-1);
      r.set_peer(-1);
      Report(r, d.lease_id);
    }
    if (pending_) StepStaged();                    // decided, admitted, past its deadline: acts now
    if (q.assignment.sync_id().empty()) continue;  // nothing runnable now
    if (q.lease_epoch != epoch_seen) {
      // A new lease means new transfer generations: old sockets are useless.
      runner_.DropTransports();
      epoch_seen = q.lease_epoch;
    }
    if (q.assignment.warm_up()) {
      RunWarmUp(q);  // no version, no owner events (agent_warm_up.cc)
      continue;
    }
    RunSync(q);
    if (pending_) StepStaged();  // a decision that came before it was armed
  }
  if (pending_) {
    // Stopping: whatever the gate holds, the live tensors stay untouched.
    gate_.Poll(absl::InfinitePast());
    gate_.Finished(pending_->q.assignment.sync_id(), /*committed=*/false);
    RollBackPending("the worker is stopping");
  }
}

void WorkerAgent::RunSync(const Queued& q) {
  const v1::SyncAssignment& a = q.assignment;
  if (RefuseIfHeldOrOlder(a, q.lease_id)) return;
  Publish(EventOf(a, v1::SyncEvent::STARTED));
  absl::Time last_progress = absl::InfinitePast();
  auto progress = [&](int32_t done, int32_t total, int64_t bytes) {
    // Throttled: the controller needs a trend, not every round. The last
    // round's is not sent: the result report follows at once with the same
    // numbers, and a second call racing it would only delay it.
    if (done >= total || absl::Now() - last_progress < absl::Milliseconds(100)) return;
    last_progress = absl::Now();
    v1::ReportProgressRequest p;
    p.set_lease_id(q.lease_id);
    p.set_sync_id(a.sync_id());
    p.set_rounds_done(done);
    p.set_rounds_total(total);
    p.set_bytes_done(bytes);
    progress_.Post(std::move(p));
  };
  const absl::Time run_start = absl::Now();
  v1::ReportResultRequest r = runner_.Run(a, stub_, q.lease_id, progress);
  r.set_received_unix_us(absl::ToUnixMicros(q.received));
  r.set_queued_seconds(absl::ToDoubleSeconds(run_start - q.received));
  r.set_run_seconds(absl::ToDoubleSeconds(absl::Now() - run_start));
  if (metrics_ != nullptr) metrics_->ChannelsCreated(runner_.channels_created());
  const bool ok = r.code() == 0;
  if (!ok) {
    spdlog::error("[worker {}] sync {} failed: {}", a.transfer(), a.sync_id(), r.message());
  }
  if (ok && r.staged()) {
    BeginStaged(q, std::move(r));  // its commit is stepped by this loop
    return;
  }
  if (ok) {
    // Before the report: whoever learns of the sync's success (the
    // trainer, then the owner's local status) sees this version applied.
    absl::MutexLock lock(&mu_);
    last_version_ = std::max(last_version_, a.version());
    int64_t& applied = applied_[a.transfer()];
    applied = std::max(applied, a.version());
  }
  Report(r, q.lease_id);
  std::string error = r.message();
  if (!ok && !a.direct_written_by().empty()) {
    // Peers write this worker's buffers directly and may still be at it
    // after this worker's part failed: the owner hears of the end only
    // once each has reported (its writes are complete) or is gone.
    const std::string pending = AwaitWriters(a, q.lease_id);
    if (!pending.empty()) {
      absl::StrAppend(&error, "; direct writers ", pending,
                      " did not report before the deadline: they may still be writing");
    }
  }
  PublishEnd(a, ok, error, /*untouched=*/false);
}

}  // namespace wsync::agent
