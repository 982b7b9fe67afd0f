// The executor's rounds (executor.h): pack, one transport round, unpack and
// the local work, with the pipelined overlap pipeline_schedule.h allows.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/exec/executor.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {
namespace {

using internal::RoundWhere;
using internal::Seconds;
using internal::Wrap;

// "peer 1: send 4,5 recv 7; peer 2: ..." (bounded).
std::string TransfersByPeer(const BoundRound& round) {
  std::map<int32_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> by_peer;
  for (const BoundTransfer& t : round.sends) by_peer[t.peer].first.push_back(t.bucket);
  for (const BoundTransfer& t : round.recvs) by_peer[t.peer].second.push_back(t.bucket);
  std::vector<std::string> parts;
  for (const auto& [peer, lists] : by_peer) {
    if (parts.size() == 8) {
      parts.push_back("...");
      break;
    }
    std::string s = absl::StrCat("peer ", peer, ":");
    auto list = [](const std::vector<int64_t>& v) {
      if (v.size() <= 6) return absl::StrJoin(v, ",");
      return absl::StrCat(absl::StrJoin(v.begin(), v.begin() + 6, ","), ",... (", v.size(), ")");
    };
    if (!lists.first.empty()) absl::StrAppend(&s, " send buckets ", list(lists.first));
    if (!lists.second.empty()) absl::StrAppend(&s, " recv buckets ", list(lists.second));
    parts.push_back(s);
  }
  return absl::StrJoin(parts, "; ");
}

// One transport message per run of consecutive staged buckets with one peer:
// NCCL moves a few large messages per group near the link rate, dozens of
// 64 MiB ones at ~70 % of it (bench/results). The binder lays out each
// direction's staging in (peer, seq) order, each bucket aligned to 64 bytes or
// to 1, so after a bucket whose size is a multiple of 64 the next one follows
// without a gap under either rule. Both sides see the same buckets (sizes,
// zero-copy flags, order) and so cut the same runs; the tag is the run's
// first bucket.
// `spans` (may be null) receives each message's buckets as [first, end) in
// `list`.
template <typename Request, typename Data>
absl::Status AppendMessages(const std::vector<BoundTransfer>& list, uint8_t* staging,
                            std::vector<Request>& out,
                            std::vector<std::pair<size_t, size_t>>* spans) {
  constexpr int64_t kJoinableMultiple = 64;
  for (size_t k = 0; k < list.size();) {
    const BoundTransfer& first = list[k];
    if (first.zero_copy) {
      out.push_back({first.peer, first.bucket, static_cast<Data>(first.direct),
                     static_cast<size_t>(first.bytes), first.step});
      if (spans != nullptr) spans->emplace_back(k, k + 1);
      ++k;
      continue;
    }
    int64_t bytes = first.bytes;
    size_t e = k + 1;
    for (; e < list.size(); ++e) {
      const BoundTransfer& prev = list[e - 1];
      const BoundTransfer& x = list[e];
      if (x.peer != first.peer || x.step != first.step || x.zero_copy ||
          prev.bytes % kJoinableMultiple != 0) {
        break;
      }
      if (x.staging_offset != prev.staging_offset + prev.bytes) {
        return absl::InternalError(
            absl::StrCat("buckets ", prev.bucket, " and ", x.bucket, " with peer ", x.peer,
                         " are not back to back in staging (", prev.staging_offset, "+", prev.bytes,
                         " vs ", x.staging_offset, "): the binder's layout rule changed"));
      }
      bytes += x.bytes;
    }
    out.push_back({first.peer, first.bucket, static_cast<Data>(staging + first.staging_offset),
                   static_cast<size_t>(bytes), first.step});
    if (spans != nullptr) spans->emplace_back(k, e);
    k = e;
  }
  return absl::OkStatus();
}
absl::Status AppendMessages(const std::vector<BoundTransfer>& list, uint8_t* staging,
                            std::vector<transport::SendRequest>& out) {
  return AppendMessages<transport::SendRequest, const void*>(list, staging, out, nullptr);
}
absl::Status AppendMessages(const std::vector<BoundTransfer>& list, uint8_t* staging,
                            std::vector<transport::RecvRequest>& out,
                            std::vector<std::pair<size_t, size_t>>& spans) {
  return AppendMessages<transport::RecvRequest, void*>(list, staging, out, &spans);
}

// A zero-copy send of a later step reads the tensor when its step runs, and
// may carry what earlier steps of its round received (plan.proto
// Bucket.step): its bytes are known only once the round's transfer ended.
bool ReadsDuringRound(const BoundTransfer& t) { return t.zero_copy && t.step > 0; }

// The round's identity and sizes in its stats.
void DescribeRound(const BoundRound& round, RoundStats& rs) {
  rs.index = round.index;
  rs.staging_bytes = round.staging_bytes;
  rs.sends = static_cast<int32_t>(round.sends.size());
  rs.recvs = static_cast<int32_t>(round.recvs.size());
  rs.copies = static_cast<int32_t>(round.copy_buckets.size());
  rs.reduces = static_cast<int32_t>(round.reduces.size());
}

}  // namespace

bool Executor::FinishesAsync(const BoundPlan& plan, size_t i) const {
  return options_.pipeline && schedule_.rounds[i].finish_async && i + 1 < plan.rounds.size();
}

uint8_t* Executor::StagingOf(size_t j) const {
  uint8_t* base = static_cast<uint8_t*>(staging_.data());
  return options_.pipeline ? base + schedule_.rounds[j].staging_offset : base;
}

absl::Status Executor::IssueLocal(const BoundPlan& plan, size_t j, uint8_t* staging,
                                  RoundStats& rs) {
  const BoundRound& round = plan.rounds[j];
  const RoundSchedule& sched = schedule_.rounds[j];
  const std::string where = RoundWhere(plan, round);
  absl::Time t = absl::Now();
  if (!round.copies.empty()) {
    RETURN_IF_ERROR(
        Wrap(ops_->Copy(round.copies, copy_handles_[j]),
             absl::StrCat(where, ": copy buckets ", absl::StrJoin(round.copy_buckets, ","))));
  }
  rs.copy_seconds += Seconds(t);
  t = absl::Now();
  if (!sched.local_reduces.empty()) {
    RETURN_IF_ERROR(Wrap(ops_->Reduce(round.reduce_inputs, sched.local_reduces, staging),
                         absl::StrCat(where, ": reduces ", absl::StrJoin(round.reduce_ids, ","))));
  }
  rs.reduce_seconds += Seconds(t);
  return absl::OkStatus();
}

absl::Status Executor::IssueAfterTransfer(const BoundPlan& plan, size_t j, uint8_t* staging,
                                          RoundStats& rs) {
  const BoundRound& round = plan.rounds[j];
  const RoundSchedule& sched = schedule_.rounds[j];
  const std::string where = RoundWhere(plan, round);
  RETURN_IF_ERROR(CheckAborted(plan, round, "unpack"));
  absl::Time t = absl::Now();
  // Received bytes sit in staging (or, zero-copy, in place) until the
  // unpack: those not hashed as they landed are hashed beside it, deferred
  // with it when the round finishes during the next transfer.
  RETURN_IF_ERROR(HashReceivedNotLanded(plan, j, staging));
  if (!round.unpack.empty()) {
    RETURN_IF_ERROR(Wrap(ops_->Unpack(staging, round.unpack), absl::StrCat(where, ": unpack")));
  }
  rs.unpack_seconds += Seconds(t);
  if (!(options_.pipeline && sched.local_early)) RETURN_IF_ERROR(IssueLocal(plan, j, staging, rs));
  t = absl::Now();
  if (!sched.staged_reduces.empty()) {
    RETURN_IF_ERROR(Wrap(ops_->Reduce(round.reduce_inputs, sched.staged_reduces, staging),
                         absl::StrCat(where, ": reduces ", absl::StrJoin(round.reduce_ids, ","))));
  }
  if (!round.quantizes.empty()) {
    RETURN_IF_ERROR(
        Wrap(ops_->Quantize(round.quantize_inputs, round.quantizes, staging),
             absl::StrCat(where, ": quantizes ", absl::StrJoin(round.quantize_ids, ","))));
  }
  rs.reduce_seconds += Seconds(t);
  return absl::OkStatus();
}

absl::Status Executor::WaitForDataOps(const std::string& where) {
  const int32_t since = unwaited_round_;
  unwaited_round_ = -1;
  absl::Status s = ops_->Synchronize();
  if (s.ok()) return s;
  if (since < 0) return Wrap(s, where);
  return Wrap(s, absl::StrCat(where, " (this wait also finished the local work queued since round ",
                              since, ")"));
}

absl::Status Executor::HashBucket(const BoundPlan& plan, const BoundRound& round,
                                  const BoundTransfer& t, uint8_t* staging, bool sent) {
  const void* data = t.zero_copy ? t.direct : staging + t.staging_offset;
  const int64_t slot = static_cast<int64_t>(queued_hashes_.size());
  queued_hashes_.push_back(BucketChecksum{t.bucket, 0, sent});
  if (absl::Status s = ops_->QueueChecksum(data, t.bytes, slot); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(RoundWhere(plan, round), ": checksum of ",
                                               sent ? "sent" : "received", " bucket ", t.bucket,
                                               " (peer ", t.peer, "): ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status Executor::HashSentBuckets(const BoundPlan& plan, const BoundRound& round,
                                       uint8_t* staging, bool relayed_in_round) {
  if (!checksums_) return absl::OkStatus();
  for (const BoundTransfer& t : round.sends) {
    if (ReadsDuringRound(t) != relayed_in_round) continue;
    RETURN_IF_ERROR(HashBucket(plan, round, t, staging, /*sent=*/true));
  }
  return absl::OkStatus();
}

absl::Status Executor::HashLanded(const BoundPlan& plan, size_t j, uint8_t* staging,
                                  absl::Span<const size_t> requests,
                                  const transport::LandingMark& mark) {
  const BoundRound& round = plan.rounds[j];
  RETURN_IF_ERROR(Wrap(ops_->WaitForLanding(mark),
                       absl::StrCat(RoundWhere(plan, round), ": received bucket checksums")));
  std::vector<uint8_t>& hashed = recv_hashed_[j];
  hashed.resize(round.recvs.size());
  for (const size_t r : requests) {
    if (r >= recv_spans_.size()) {
      return absl::InternalError(absl::StrCat(RoundWhere(plan, round),
                                              ": the transport named receive ", r, " of ",
                                              recv_spans_.size()));
    }
    for (size_t b = recv_spans_[r].first; b < recv_spans_[r].second; ++b) {
      if (hashed[b]) continue;
      RETURN_IF_ERROR(HashBucket(plan, round, round.recvs[b], staging, false));
      hashed[b] = 1;
      ++hashed_as_landed_;
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::HashReceivedNotLanded(const BoundPlan& plan, size_t j, uint8_t* staging) {
  if (!checksums_) return absl::OkStatus();
  const BoundRound& round = plan.rounds[j];
  const std::vector<uint8_t>& hashed = recv_hashed_[j];
  for (size_t b = 0; b < round.recvs.size(); ++b) {
    if (b < hashed.size() && hashed[b]) continue;
    RETURN_IF_ERROR(HashBucket(plan, round, round.recvs[b], staging, false));
  }
  return absl::OkStatus();
}

absl::Status Executor::ResetHashes(const BoundPlan& plan) {
  queued_hashes_.clear();
  recv_hashed_.clear();
  hashed_as_landed_ = 0;
  if (!checksums_) return absl::OkStatus();
  recv_hashed_.resize(plan.rounds.size());
  int64_t slots = 0;
  for (const BoundRound& r : plan.rounds) {
    slots += static_cast<int64_t>(r.sends.size() + r.recvs.size());
  }
  slots += static_cast<int64_t>(plan.direct_buckets.size());
  queued_hashes_.reserve(static_cast<size_t>(slots));
  return Wrap(ops_->ResetChecksums(slots), "bucket checksums");
}

absl::Status Executor::CollectHashes(SyncStats& sync) {
  if (!checksums_) return absl::OkStatus();
  auto hashes = ops_->CollectChecksums();
  if (!hashes.ok()) return Wrap(hashes.status(), "bucket checksums");
  if (hashes->size() < queued_hashes_.size()) {
    return absl::InternalError(absl::StrCat("bucket checksums: ", hashes->size(), " collected for ",
                                            queued_hashes_.size(), " queued"));
  }
  for (size_t i = 0; i < queued_hashes_.size(); ++i) {
    BucketChecksum c = queued_hashes_[i];
    c.hash = (*hashes)[i];
    sync.checksums.push_back(c);
  }
  sync.recv_hashes_as_landed = hashed_as_landed_;
  return absl::OkStatus();
}

absl::Status Executor::Transfer(const BoundPlan& plan, size_t i, uint8_t* staging,
                                absl::Time deadline, const std::function<void()>& on_posted,
                                RoundStats& rs) {
  const BoundRound& round = plan.rounds[i];
  const std::string where = RoundWhere(plan, round);
  send_reqs_.clear();
  recv_reqs_.clear();
  recv_spans_.clear();
  RETURN_IF_ERROR(Wrap(AppendMessages(round.sends, staging, send_reqs_), where));
  RETURN_IF_ERROR(Wrap(AppendMessages(round.recvs, staging, recv_reqs_, recv_spans_), where));
  rs.messages = static_cast<int32_t>(send_reqs_.size() + recv_reqs_.size());
  transport::RoundHooks hooks;
  hooks.on_posted = on_posted;
  absl::Status landed_status;
  if (checksums_) {
    // Every round is cut alike on both sides of a pair (transport.h); only a
    // round that ends with a wait hashes its receives as they land
    // (executor.h): a finished-async round's hashes go with its unpack into
    // the next transfer, never holding the next round's pack wait.
    hooks.max_landing_parts = options_.landing_parts;
    hooks.min_landing_part_bytes = options_.min_landing_part_bytes;
  }
  if (checksums_ && !FinishesAsync(plan, i)) {
    hooks.on_landed = [&](absl::Span<const size_t> requests, const transport::LandingMark& m) {
      if (landed_status.ok()) landed_status = HashLanded(plan, i, staging, requests, m);
    };
  }
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  absl::Status s = transport_->RunRound(send_reqs_, recv_reqs_, round_deadline, hooks);
  if (s.ok()) s = landed_status;
  if (!s.ok()) {
    if (aborted_.load()) RETURN_IF_ERROR(CheckAborted(plan, round, "transfer"));
    return absl::Status(s.code(), absl::StrCat(where, ": transfer (", TransfersByPeer(round),
                                               ") failed: ", s.message()));
  }
  rs.bytes_sent = round.bytes_sent;
  rs.bytes_received = round.bytes_received;
  // Zero-copy sends of later steps may carry what this round brought: their
  // bytes are final only now.
  return HashSentBuckets(plan, round, staging, /*relayed_in_round=*/true);
}

absl::Status Executor::RunRound(const BoundPlan& plan, size_t i, absl::Time deadline, Carry& carry,
                                RoundStats& rs, SyncStats& sync) {
  const bool packed = carry.packed;
  const bool prev_deferred = carry.deferred;
  carry = Carry();
  const BoundRound& round = plan.rounds[i];
  uint8_t* const staging = StagingOf(i);
  const RoundSchedule& sched = schedule_.rounds[i];
  const bool pipeline = options_.pipeline;
  const bool local_early = pipeline && sched.local_early;
  const std::string where = RoundWhere(plan, round);
  DescribeRound(round, rs);

  RETURN_IF_ERROR(CheckAborted(plan, round, "pack"));
  absl::Time t = absl::Now();
  if (!packed && !round.pack.empty()) {
    RETURN_IF_ERROR(Wrap(ops_->Pack(round.pack, staging), absl::StrCat(where, ": pack")));
  }
  // The data ops run in their stream's order; only the transport, on its own
  // stream, must wait. A round without transfers (only local work, as with
  // direct writes) therefore waits for nothing: its copies queue behind the
  // previous round's and the GPU never drains between them.
  const bool transfers = !round.sends.empty() || !round.recvs.empty();
  if (transfers) {
    // Everything issued so far: this round's pack, the previous round's early
    // local work, and the unpack that last read this round's staging set. (A
    // deferred unpack of the previous round is not issued yet.)
    RETURN_IF_ERROR(WaitForDataOps(absl::StrCat(where, ": pack")));
  } else if (unwaited_round_ < 0) {
    unwaited_round_ = round.index;
  }
  rs.pack_seconds = Seconds(t);

  // The other set holds the previous round's received bytes until its
  // unpack ran, then the next round's packed bytes (in that order).
  int64_t other_set = prev_deferred ? plan.rounds[i - 1].staging_bytes : 0;
  int64_t in_use = round.staging_bytes + other_set;
  current_staging_.store(in_use);
  const bool pack_next =
      pipeline && i + 1 < plan.rounds.size() && schedule_.rounds[i + 1].pack_ahead;
  if (pack_next) {
    other_set = std::max(other_set, plan.rounds[i + 1].staging_bytes);
    in_use = round.staging_bytes + other_set;
  }
  sync.peak_staging_bytes = std::max(sync.peak_staging_bytes, in_use);

  // Work that overlaps the transfer, issued once the transfer is posted. In
  // stream order: the previous round's deferred unpack (it reads the other
  // set), this round's early local work, then the next round's pack (it
  // overwrites the other set).
  absl::Status overlap_status;
  bool posted = false;
  auto on_posted = [&]() {
    posted = true;
    overlap_status = [&]() -> absl::Status {
      // What goes on the wire sits in staging (packed and waited for) and
      // stays there until the next pack into this set, queued after this:
      // the hash reads it beside the transport.
      RETURN_IF_ERROR(HashSentBuckets(plan, round, staging, /*relayed_in_round=*/false));
      if (prev_deferred) RETURN_IF_ERROR(IssueAfterTransfer(plan, i - 1, StagingOf(i - 1), rs));
      if (local_early) {
        RETURN_IF_ERROR(CheckAborted(plan, round, "copy"));
        RETURN_IF_ERROR(IssueLocal(plan, i, staging, rs));
        ++sync.rounds_local_early;
      }
      if (pack_next) {
        const BoundRound& next = plan.rounds[i + 1];
        RETURN_IF_ERROR(CheckAborted(plan, next, "pack"));
        current_staging_.store(in_use);
        const absl::Time tp = absl::Now();
        RETURN_IF_ERROR(
            Wrap(ops_->Pack(next.pack, StagingOf(i + 1)),
                 absl::StrCat(RoundWhere(plan, next), ": pack (during round ", round.index, ")")));
        rs.pack_seconds += Seconds(tp);
        carry.packed = true;
        ++sync.rounds_packed_ahead;
      }
      return absl::OkStatus();
    }();
  };

  RETURN_IF_ERROR(CheckAborted(plan, round, "transfer"));
  t = absl::Now();
  if (transfers) RETURN_IF_ERROR(Transfer(plan, i, staging, deadline, on_posted, rs));
  if (!posted) on_posted();  // nothing to transfer
  RETURN_IF_ERROR(overlap_status);
  // Received and not unpacked yet (this round's unpack is issued below or
  // by the next round): staging holds the wire bytes.
  rs.transfer_seconds = Seconds(t);

  if (FinishesAsync(plan, i)) {
    carry.deferred = true;  // issued by the next round once its transfer is posted
    ++sync.rounds_finished_async;
  } else {
    RETURN_IF_ERROR(IssueAfterTransfer(plan, i, staging, rs));
    if (transfers || (i + 1 == plan.rounds.size() && !hold_last_wait_)) {
      t = absl::Now();
      RETURN_IF_ERROR(WaitForDataOps(absl::StrCat(where, ": finishing the round")));
      rs.reduce_seconds += Seconds(t);
    }
  }
  rs.bytes_local = round.bytes_local;
  return absl::OkStatus();
}

}  // namespace wsync::exec
