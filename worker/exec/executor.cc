#include "worker/exec/executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {
namespace {

using internal::LocalOnly;
using internal::RoundWhere;
using internal::Seconds;

// Adds round `rs` (of `round`) to the sync's stats and progress.
void CountRound(const BoundRound& round, const RoundStats& rs, SyncStats& stats, Progress& p) {
  stats.bytes_sent += rs.bytes_sent;
  stats.bytes_received += rs.bytes_received;
  stats.bytes_local += rs.bytes_local;
  stats.peak_staging_bytes = std::max(stats.peak_staging_bytes, rs.staging_bytes);
  stats.rounds.push_back(rs);
  p.round_index = round.index;
  ++p.rounds_done;
  p.bytes_done += rs.bytes_sent + rs.bytes_received + rs.bytes_local;
}

}  // namespace

Executor::Executor(transport::Transport* transport, DataOps* ops, PeerWriter* writer,
                   ExecutorOptions options)
    : transport_(transport), ops_(ops), writer_(writer), options_(options) {}

void Executor::Abort(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  aborted_.store(true);
  transport_->Abort(reason);
}

void Executor::ReleaseStaging() {
  staging_.Reset();
  allocated_staging_.store(0);
}

absl::Status Executor::CheckAborted(const BoundPlan& plan, const BoundRound& round,
                                    const char* phase) {
  if (!aborted_.load()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return absl::CancelledError(
      absl::StrCat(RoundWhere(plan, round), " ", phase, ": aborted: ", abort_reason_));
}

absl::Status Executor::CheckRunnable(const BoundPlan& plan, uint64_t registry_generation,
                                     bool direct) const {
  if (plan.registry_generation != registry_generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", plan.worker, ": plan '", plan.key, "' was bound against registry generation ",
        plan.registry_generation, ", the registry is at ", registry_generation, "; rebind it"));
  }
  if (plan.space != ops_->memory_space() || plan.space != transport_->memory_space()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", plan.worker, ": plan bound for another memory space than the data ops (",
        ops_->Name(), ") or the transport (", transport_->Name(), ")"));
  }
  if (transport_->rank() != plan.worker) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan bound for worker ", plan.worker, " but the transport is rank ", transport_->rank()));
  }
  if (direct && (writer_ == nullptr || writer_->memory_space() != plan.space)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", plan.worker, ": plan '", plan.key, "' writes peers directly, but ",
        writer_ == nullptr
            ? "this data plane has no peer writer"
            : absl::StrCat("the peer writer (", writer_->Name(), ") moves another memory space")));
  }
  return absl::OkStatus();
}

absl::Status Executor::PrepareStaging(const BoundPlan& plan) {
  // Also refuses a plan round over the staging limit, pipelined or not.
  ASSIGN_OR_RETURN(const PipelineSchedule* sched, ScheduleFor(plan));
  const int64_t need = options_.pipeline ? sched->staging_bytes : plan.max_staging_bytes;
  if (staging_.bytes() < need) {
    staging_.Reset();  // free first: never hold old and new together
    allocated_staging_.store(0);
    ASSIGN_OR_RETURN(staging_, ops_->AllocateStaging(need));
    allocated_staging_.store(staging_.bytes());
  }
  return absl::OkStatus();
}

absl::StatusOr<SyncStats> Executor::Run(const BoundPlan& plan, uint64_t registry_generation,
                                        absl::Time deadline, const ProgressCallback& progress) {
  const absl::Time start = absl::Now();
  const bool direct = !plan.direct_write_to.empty() || !plan.direct_written_by.empty();
  // Decided first: a failure before the tokens posts the failure marker too.
  mailbox_sync_ = direct && UseMailbox(plan);
  mailbox_begun_ = false;
  ready_posted_.clear();
  done_posted_.clear();
  absl::Status ready = CheckRunnable(plan, registry_generation, direct);
  if (ready.ok()) ready = PrepareStaging(plan);
  if (ready.ok()) ready = ResetHashes(plan);
  if (!ready.ok()) {
    // Its peers would otherwise wait for its tokens until the round's
    // deadline or the controller's abort.
    PostMailboxFailure(plan);
    return ready;
  }
  unwaited_round_ = -1;
  SyncState sync(plan, deadline, progress);
  // With direct writes the sync waits for its local work once, after the
  // puts and the done tokens: the last round does not drain the device.
  hold_last_wait_ = direct;
  if (direct) {
    // Leading rounds with only local work wait for no peer: up to
    // early_local_rounds of them are queued as soon as the ready tokens'
    // transfer is posted (NCCL's kernel first, the copies beside them), so
    // local copies run while the tokens travel. LocalOnly rounds never call
    // the transport, which is busy with the tokens here.
    auto queue_local_rounds = [&]() -> absl::Status {
      absl::Status early;
      sync.hold_progress = true;
      for (int n = 0;
           early.ok() && sync.next < plan.rounds.size() && LocalOnly(plan.rounds[sync.next]) &&
           (options_.early_local_rounds < 0 || n < options_.early_local_rounds);
           ++n) {
        early = Step(sync);
      }
      sync.hold_progress = false;
      return early;
    };
    if (absl::Status s = StartDirectWrites(plan, deadline, queue_local_rounds, sync.stats);
        !s.ok()) {
      CleanUpAfterFailure(direct);
      PostMailboxFailure(plan);
      return s;
    }
    if (sync.progress_held && progress) progress(sync.p);
  }
  while (sync.next < plan.rounds.size()) {
    if (absl::Status s = Step(sync); !s.ok()) {
      CleanUpAfterFailure(direct);
      if (direct) PostMailboxFailure(plan);
      return s;
    }
  }
  current_staging_.store(0);
  if (direct) {
    RETURN_IF_ERROR(FinishDirectWrites(plan, deadline, sync.stats));
    sync.p.bytes_done += plan.bytes_put + plan.bytes_put_into;
    sync.p.round_index = Progress::kDirectWrites;
    if (progress) progress(sync.p);
  }
  RETURN_IF_ERROR(CollectHashes(sync.stats));
  sync.stats.seconds = Seconds(start);
  return std::move(sync.stats);
}

Executor::SyncState::SyncState(const BoundPlan& plan, absl::Time deadline,
                               const ProgressCallback& progress)
    : plan(plan), deadline(deadline), progress(progress) {
  p.worker = plan.worker;
  p.rounds_total = static_cast<int32_t>(plan.rounds.size());
  p.bytes_total = plan.total_bytes;
}

absl::Status Executor::Step(SyncState& sync) {
  const BoundPlan& plan = sync.plan;
  const size_t i = sync.next++;
  const BoundRound& round = plan.rounds[i];
  RoundStats rs;
  if (absl::Now() >= sync.deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        RoundWhere(plan, round), ": the sync deadline passed before the round started"));
  }
  RETURN_IF_ERROR(RunRound(plan, i, sync.deadline, sync.carry, rs, sync.stats));
  // Between rounds: this round's bytes until its deferred unpack ran, and the
  // next round's if packed ahead.
  current_staging_.store((sync.carry.deferred ? round.staging_bytes : 0) +
                         (sync.carry.packed ? plan.rounds[i + 1].staging_bytes : 0));
  CountRound(round, rs, sync.stats, sync.p);
  if (sync.hold_progress) {
    sync.progress_held = true;
  } else if (sync.progress) {
    sync.progress(sync.p);
  }
  return absl::OkStatus();
}

void Executor::CleanUpAfterFailure(bool direct) {
  ops_->Synchronize().IgnoreError();
  if (direct) writer_->Fence().IgnoreError();
  current_staging_.store(0);
}

absl::StatusOr<const PipelineSchedule*> Executor::ScheduleFor(const BoundPlan& plan) {
  if (schedule_instance_ != plan.instance.value() ||
      schedule_.rounds.size() != plan.rounds.size()) {
    schedule_instance_ = 0;
    ASSIGN_OR_RETURN(schedule_, BuildPipelineSchedule(plan, options_.staging_limit_bytes));
    copy_handles_.clear();
    for (const BoundRound& r : plan.rounds) {
      copy_handles_.push_back(r.copies.empty() ? ItemsHandle{} : ops_->Prepare(r.copies));
    }
    // An empty list too: a writer that reserved resources for the last
    // plan's puts (the CUDA put SMs) gives them back.
    put_handle_ = writer_ == nullptr ? ItemsHandle{} : writer_->Prepare(plan.puts);
    PrepareDirectParts(plan);
    phase_gates_.Prepare(plan, writer_);
    schedule_instance_ = plan.instance.value();
  }
  return &schedule_;
}

}  // namespace wsync::exec
