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
  RETURN_IF_ERROR(CheckRunnable(plan, registry_generation, direct));
  RETURN_IF_ERROR(PrepareStaging(plan));
  SyncStats stats;
  unwaited_round_ = -1;
  Progress p;
  p.worker = plan.worker;
  p.rounds_total = static_cast<int32_t>(plan.rounds.size());
  p.bytes_total = plan.total_bytes;
  // With direct writes the sync waits for its local work once, after the
  // puts and the done tokens: the last round does not drain the device.
  hold_last_wait_ = direct;
  Carry carry;  // what the last round run left to the next
  size_t next = 0;
  // Progress of rounds queued while a transport round is in flight is
  // reported after it: the callback may block (the worker reports over gRPC).
  bool hold_progress = false;
  bool progress_held = false;
  // After a failure: nothing issued so far outlives the sync (staging may be
  // freed or reused next, peer mappings closed); their own errors are
  // secondary. Never while a transport round is in flight: the data ops may
  // free memory there, which waits for the whole device (retired_memory.h).
  auto clean_up = [&] {
    ops_->Synchronize().IgnoreError();
    if (direct) writer_->Fence().IgnoreError();
    current_staging_.store(0);
  };
  // Runs plan.rounds[next] and counts it; the caller cleans up on failure.
  auto step = [&]() -> absl::Status {
    const size_t i = next++;
    const BoundRound& round = plan.rounds[i];
    absl::Status s;
    RoundStats rs;
    if (absl::Now() >= deadline) {
      s = absl::DeadlineExceededError(absl::StrCat(
          RoundWhere(plan, round), ": the sync deadline passed before the round started"));
    } else {
      s = RunRound(plan, i, deadline, carry, rs, stats);
    }
    if (!s.ok()) return s;
    // Between rounds: this round's bytes until its deferred unpack ran, and
    // the next round's if packed ahead.
    current_staging_.store((carry.deferred ? round.staging_bytes : 0) +
                           (carry.packed ? plan.rounds[i + 1].staging_bytes : 0));
    CountRound(round, rs, stats, p);
    if (hold_progress) {
      progress_held = true;
    } else if (progress) {
      progress(p);
    }
    return absl::OkStatus();
  };
  if (direct) {
    // Leading rounds with only local work wait for no peer: up to
    // early_local_rounds of them are queued as soon as the ready tokens'
    // transfer is posted (NCCL's kernel first, the copies beside them), so
    // local copies run while the tokens travel. LocalOnly rounds never call
    // the transport, which is busy with the tokens here.
    auto queue_local_rounds = [&]() -> absl::Status {
      absl::Status early;
      hold_progress = true;
      for (int n = 0; early.ok() && next < plan.rounds.size() && LocalOnly(plan.rounds[next]) &&
                      (options_.early_local_rounds < 0 || n < options_.early_local_rounds);
           ++n) {
        early = step();
      }
      hold_progress = false;
      return early;
    };
    if (absl::Status s = StartDirectWrites(plan, deadline, queue_local_rounds, stats); !s.ok()) {
      clean_up();
      return s;
    }
    if (progress_held && progress) progress(p);
  }
  while (next < plan.rounds.size()) {
    if (absl::Status s = step(); !s.ok()) {
      clean_up();
      return s;
    }
  }
  current_staging_.store(0);
  if (direct) {
    RETURN_IF_ERROR(FinishDirectWrites(plan, deadline, stats));
    p.bytes_done += plan.bytes_put + plan.bytes_put_into;
    p.round_index = Progress::kDirectWrites;
    if (progress) progress(p);
  }
  stats.seconds = Seconds(start);
  return stats;
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
    put_handle_ =
        plan.puts.empty() || writer_ == nullptr ? ItemsHandle{} : writer_->Prepare(plan.puts);
    schedule_instance_ = plan.instance.value();
  }
  return &schedule_;
}

}  // namespace wsync::exec
