// Direct writes (executor.h): ready tokens from the receivers to the senders
// that write them before the first put, the puts, and done tokens back after
// the last; and the warm-up's one message per peer.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/exec/executor.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {
namespace {

// "worker W: direct writes to workers ...", and the put's origin (round,
// bucket, piece, tensor) when the data ops' error names one put item.
std::string PutsWhere(const BoundPlan& plan, const absl::Status& s) {
  std::string where = absl::StrCat("worker ", plan.worker, ": direct writes to workers ",
                                   absl::StrJoin(plan.direct_write_to, ","));
  const int64_t item = ErrorItemIndex(s);
  if (item >= 0 && item < static_cast<int64_t>(plan.put_origins.size())) {
    absl::StrAppend(&where, " (put item ", item, ": ", plan.put_origins[item], ")");
  }
  return where;
}

}  // namespace

using internal::DirectPeers;
using internal::LocalOnly;
using internal::Seconds;
using internal::Wrap;

absl::Status Executor::ExchangeTokens(const BoundPlan& plan, bool ready, absl::Time deadline,
                                      const std::function<void()>& on_posted) {
  // Ready tokens go from receivers to the senders that write them, done
  // tokens back. Their bytes carry nothing: arriving is the message.
  const std::vector<int32_t>& to = ready ? plan.direct_written_by : plan.direct_write_to;
  const std::vector<int32_t>& from = ready ? plan.direct_write_to : plan.direct_written_by;
  const int64_t tag = ready ? kReadyTokenTag : kDoneTokenTag;
  const char* what = ready ? "ready tokens" : "done tokens";
  const std::string where =
      absl::StrCat("worker ", plan.worker, ": direct-write ", what, " (to workers ",
                   absl::StrJoin(to, ","), ", from workers ", absl::StrJoin(from, ","), ")");
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(where, ": the sync deadline passed"));
  }
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": this worker's data plane has no peer writer"));
  }
  constexpr size_t kTokenBytes = PeerWriter::kTokenBytes;
  auto slots = writer_->TokenSlots(to.size() + from.size());
  if (!slots.ok()) return Wrap(slots.status(), where);
  uint8_t* base = *slots;
  const uint64_t value = ready ? plan.ready_token : 0;
  for (size_t k = 0; k < to.size(); ++k) {
    RETURN_IF_ERROR(Wrap(writer_->WriteToken(base + k * kTokenBytes, value), where));
  }
  send_reqs_.clear();
  recv_reqs_.clear();
  for (size_t k = 0; k < to.size(); ++k) {
    send_reqs_.push_back({to[k], tag, base + k * kTokenBytes, kTokenBytes});
  }
  for (size_t k = 0; k < from.size(); ++k) {
    recv_reqs_.push_back({from[k], tag, base + (to.size() + k) * kTokenBytes, kTokenBytes});
  }
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  const absl::Status s = transport_->RunRound(send_reqs_, recv_reqs_, round_deadline, on_posted);
  if (s.ok() && ready) {
    for (size_t k = 0; k < from.size(); ++k) {
      auto read = writer_->ReadToken(base + (to.size() + k) * kTokenBytes);
      if (!read.ok()) return Wrap(read.status(), where);
      const uint64_t got = *read;
      auto want = plan.expected_ready_tokens.find(from[k]);
      if (want == plan.expected_ready_tokens.end() || want->second != got) {
        return absl::AbortedError(absl::StrCat(
            where, ": worker ", from[k],
            "'s registered buffers differ from the ones this worker mapped for it (its owner "
            "registered again after the controller assigned the sync); nothing was written to it, "
            "the "
            "next sync uses the new registration"));
      }
    }
  }
  if (s.ok()) return s;
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
  }
  return absl::Status(s.code(), absl::StrCat(where, " failed: ", s.message()));
}

absl::Status Executor::StartDirectWrites(const BoundPlan& plan, absl::Time deadline,
                                         const std::function<absl::Status()>& on_ready_posted,
                                         SyncStats& stats) {
  // Before the first write: every receiver this worker writes is ready.
  absl::Status early;
  const absl::Time tt = absl::Now();
  auto on_posted = [&] { early = on_ready_posted(); };
  const absl::Status s = mailbox_sync_ ? MailboxReady(plan, deadline, on_posted, stats)
                                       : ExchangeTokens(plan, /*ready=*/true, deadline, on_posted);
  stats.ready_token_seconds = Seconds(tt);
  stats.token_seconds += stats.ready_token_seconds;
  RETURN_IF_ERROR(early);
  RETURN_IF_ERROR(s);
  // The puts run beside all rounds; they need no staging.
  const absl::Time t = absl::Now();
  // Alone: no round has data-op work or transfers (NCCL's kernels need SMs
  // too) to run beside the puts.
  bool alone = true;
  for (const BoundRound& r : plan.rounds) {
    alone = alone && LocalOnly(r) && r.copies.empty() && r.reduces.empty() && r.quantizes.empty();
  }
  const absl::Status put = IssuePuts(plan, alone, stats);
  stats.put_issue_seconds = Seconds(t);
  return put;
}

bool Executor::UseGates(const BoundPlan& plan) const {
  // A plan whose puts form no phase ranges (PhaseGates::Prepare: phases
  // outside [0, kAllPhases) or not one range each) puts everything at once.
  return mailbox_sync_ && options_.put_phase_gates &&
         options_.put_gate_timeout > absl::ZeroDuration() && writer_->HasPutGates() &&
         !SplitPuts(plan) && (plan.puts.empty() || phase_gates_.num_ranges() > 0);
}

absl::Status Executor::IssuePuts(const BoundPlan& plan, bool alone, SyncStats& stats) {
  step_marks_.clear();
  const std::vector<int32_t> peers = DirectPeers(plan);
  const bool gated = UseGates(plan);
  if (gated) {
    auto before = writer_->GatesTimedOut();
    if (!before.ok()) return Wrap(before.status(), PutsWhere(plan, before.status()));
    gates_timed_out_before_ = *before;
    // A gate never outwaits the round's own limit.
    const absl::Duration timeout = std::min(options_.put_gate_timeout, options_.round_timeout);
    const absl::Status put =
        phase_gates_.Issue(plan, *writer_, mailbox_seq_, peers, alone, timeout, &stats.put_gates);
    if (!put.ok()) return Wrap(put, PutsWhere(plan, put));
  } else if (mailbox_sync_) {
    // No gates here: no peer waits for this worker's phases.
    const absl::Status s = PhaseGates::PostAllPhases(*writer_, plan.worker, mailbox_seq_, peers);
    if (!s.ok()) {
      return MailboxError(s, absl::StrCat("worker ", plan.worker,
                                          ": posting 'no phase gates' to its direct-write peers ",
                                          absl::StrJoin(peers, ",")));
    }
  }
  if (plan.puts.empty() || gated) {
    // Nothing to put (a receiver only), or put above.
  } else if (!SplitPuts(plan)) {
    const absl::Status put = writer_->Put(plan.puts, put_handle_, alone);
    if (!put.ok()) return Wrap(put, PutsWhere(plan, put));
  } else {
    // One part at a time, a mark after each (PumpDirectParts posts them).
    for (size_t k = 0; k < step_puts_.size(); ++k) {
      const absl::Status put = writer_->Put(step_puts_[k], step_handles_[k], alone);
      if (!put.ok()) {
        // The error's item index is the step's: name the put by plan.puts.
        const int64_t item = ErrorItemIndex(put);
        const int64_t index = item >= 0 && item < static_cast<int64_t>(step_put_index_[k].size())
                                  ? step_put_index_[k][static_cast<size_t>(item)]
                                  : -1;
        return Wrap(put, absl::StrCat(PutsWhere(plan, index >= 0 ? TagItem(put, index) : put),
                                      " (part ", k, " of its puts)"));
      }
      auto mark = writer_->Mark();
      if (!mark.ok())
        return Wrap(mark.status(), absl::StrCat("worker ", plan.worker, ": put mark"));
      step_marks_.push_back(*mark);
    }
  }
  if (!checksums_) return absl::OkStatus();
  // The sources stay unchanged through the sync: hashed beside the puts.
  for (size_t d = 0; d < plan.direct_buckets.size(); ++d) {
    if (plan.direct_buckets[d].sent) RETURN_IF_ERROR(QueueDirectHash(plan, d));
  }
  return absl::OkStatus();
}

absl::Status Executor::FinishDirectWrites(const BoundPlan& plan, absl::Time deadline,
                                          SyncStats& stats) {
  const absl::Time t = absl::Now();
  // With checksums over mailboxes: each part's count goes to its receiver
  // as it lands, and the parts written into this worker are hashed as theirs
  // arrive (then the fence below finds every put done).
  absl::Status s =
      checksums_ && mailbox_sync_ ? PumpDirectParts(plan, deadline, stats) : absl::OkStatus();
  // Fenced also after a failure: no put outlives the sync.
  absl::Status fenced = writer_->Fence();
  if (!fenced.ok()) fenced = Wrap(fenced, PutsWhere(plan, fenced));
  if (s.ok()) s = fenced;
  if (s.ok() && stats.put_gates > 0) {
    // A count for metrics only: an unreadable one fails nothing.
    auto timed_out = writer_->GatesTimedOut();
    if (timed_out.ok()) stats.put_gates_timed_out = *timed_out - gates_timed_out_before_;
  }
  stats.put_wait_seconds = Seconds(t);
  // After the last write: the receivers learn their bytes are in place. The
  // local work may still run; this sync ends once it finished too.
  if (s.ok()) {
    const absl::Time tt = absl::Now();
    s = mailbox_sync_ ? MailboxDone(plan, deadline, stats)
                      : ExchangeTokens(plan, /*ready=*/false, deadline, nullptr);
    stats.token_seconds += Seconds(tt);
  }
  if (s.ok() && checksums_ && !mailbox_sync_) s = HashDirectReceived(plan);
  const absl::Time tf = absl::Now();
  const absl::Status local = WaitForDataOps(
      plan.rounds.empty()
          ? absl::StrCat("worker ", plan.worker, ": local work")
          : absl::StrCat(internal::RoundWhere(plan, plan.rounds.back()), ": finishing the round"));
  stats.local_wait_seconds = Seconds(tf);
  if (!s.ok() || !local.ok()) PostMailboxFailure(plan);
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(local);
  stats.bytes_sent += plan.bytes_put;
  stats.bytes_received += plan.bytes_put_into;
  stats.bytes_put = plan.bytes_put;
  stats.bytes_put_into = plan.bytes_put_into;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Executor::WarmUp(const BoundPlan& plan, uint64_t registry_generation,
                                         absl::Time deadline) {
  const bool direct = !plan.direct_write_to.empty() || !plan.direct_written_by.empty();
  RETURN_IF_ERROR(CheckRunnable(plan, registry_generation, direct));
  RETURN_IF_ERROR(PrepareStaging(plan));
  // Every peer the plan exchanges anything with: a transfer from A to B is
  // in both parts, and so is a direct-write pair (its tokens).
  std::set<int32_t> peers(plan.direct_write_to.begin(), plan.direct_write_to.end());
  peers.insert(plan.direct_written_by.begin(), plan.direct_written_by.end());
  for (const BoundRound& r : plan.rounds) {
    for (const BoundTransfer& t : r.sends) peers.insert(t.peer);
    for (const BoundTransfer& t : r.recvs) peers.insert(t.peer);
  }
  if (peers.empty()) return 0;
  const std::string where = absl::StrCat("worker ", plan.worker, ": warm-up messages with workers ",
                                         absl::StrJoin(peers, ","));
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
  }
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": this worker's data plane has no peer writer (its token slots)"));
  }
  constexpr size_t kTokenBytes = PeerWriter::kTokenBytes;
  auto slots = writer_->TokenSlots(2 * peers.size());
  if (!slots.ok()) return Wrap(slots.status(), where);
  uint8_t* base = *slots;
  send_reqs_.clear();
  recv_reqs_.clear();
  size_t k = 0;
  for (int32_t peer : peers) {
    RETURN_IF_ERROR(Wrap(writer_->WriteToken(base + k * kTokenBytes, 0), where));
    send_reqs_.push_back({peer, kWarmUpTag, base + k * kTokenBytes, kTokenBytes});
    recv_reqs_.push_back({peer, kWarmUpTag, base + (peers.size() + k) * kTokenBytes, kTokenBytes});
    ++k;
  }
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  const absl::Status s = transport_->RunRound(send_reqs_, recv_reqs_, round_deadline, nullptr);
  if (s.ok() && direct && UseMailbox(plan)) {
    // The mailbox descriptors too: the first sync then posts its tokens
    // right away.
    RETURN_IF_ERROR(EnsureMailboxes(plan, deadline, nullptr, nullptr));
  }
  if (s.ok()) return static_cast<int32_t>(peers.size());
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
  }
  return absl::Status(s.code(), absl::StrCat(where, " failed: ", s.message()));
}

}  // namespace wsync::exec
