// Direct-write tokens through peer mailboxes (executor.h, PeerWriter's
// mailbox contract): the descriptor exchange, the per-peer sequences, and
// posting and polling ready / done tokens.
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/exec/executor.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {

using internal::Wrap;

namespace {

using internal::DirectPeers;
using internal::kDone;
using internal::kParts;
using internal::kPhase;
using internal::kReadyFingerprint;
using internal::kReadySeq;
using internal::kSlotsPerPeer;

}  // namespace

absl::Status Executor::MailboxError(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  if (aborted_.load()) {
    // A mailbox step cut by an abort (e.g. a peer that left its exchange)
    // ends as a cut round does: CANCELLED, not the step's own error.
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(
        absl::StrCat(where, ": aborted: ", abort_reason_, " (then: ", s.message(), ")"));
  }
  return Wrap(s, where);
}

bool Executor::UseMailbox(const BoundPlan& plan) const {
  (void)plan;
  return options_.mailbox_tokens && writer_ != nullptr && writer_->HasMailbox();
}

std::string Executor::TokenWhere(const BoundPlan& plan, bool ready) const {
  const std::vector<int32_t>& to = ready ? plan.direct_written_by : plan.direct_write_to;
  const std::vector<int32_t>& from = ready ? plan.direct_write_to : plan.direct_written_by;
  return absl::StrCat("worker ", plan.worker, ": direct-write ", ready ? "ready" : "done",
                      " tokens (to workers ", absl::StrJoin(to, ","), ", from workers ",
                      absl::StrJoin(from, ","), ")");
}

absl::Status Executor::EnsureMailboxes(const BoundPlan& plan, absl::Time deadline,
                                       const std::function<void()>& on_posted, SyncStats* stats) {
  std::vector<int32_t> fresh;
  for (int32_t p : DirectPeers(plan)) {
    if (mailbox_peers_.count(p) == 0) fresh.push_back(p);
  }
  if (fresh.empty()) return absl::OkStatus();
  const std::string where = absl::StrCat("worker ", plan.worker,
                                         ": direct-write ready tokens (mailbox descriptors with "
                                         "workers ",
                                         absl::StrJoin(fresh, ","), ")");
  const int32_t size = transport_->size();
  for (int32_t p : fresh) {
    if (p < 0 || p >= size || p == plan.worker) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": worker ", p, " is no peer rank of a transport of ", size));
    }
  }
  if (!mailbox_created_) {
    auto d = writer_->CreateMailbox(kSlotsPerPeer * size);
    if (!d.ok()) return MailboxError(d.status(), where);
    mailbox_descriptor_ = *std::move(d);
    mailbox_created_ = true;
  }
  constexpr size_t kBytes = PeerWriter::kMailboxDescriptorBytes;
  constexpr size_t kWords = kBytes / PeerWriter::kTokenBytes;
  static_assert(kWords * PeerWriter::kTokenBytes == kBytes, "descriptor of whole tokens");
  // What each fresh peer is sent: an object of its own where the writer
  // shares that way (the host's, unlinked once the peer mapped it), else
  // the one mailbox's descriptor.
  std::vector<std::string> mine;
  for (int32_t p : fresh) {
    auto d = writer_->ShareMailbox(p, kSlotsPerPeer * p, kSlotsPerPeer);
    if (d.status().code() == absl::StatusCode::kUnimplemented) break;
    if (!d.ok()) return MailboxError(d.status(), where);
    mine.push_back(*std::move(d));
  }
  if (mine.size() != fresh.size()) mine.assign(1, mailbox_descriptor_);
  const size_t sent = mine.size();  // descriptors at the front of the slots
  auto slots = writer_->TokenSlots(kWords * (sent + fresh.size()));
  if (!slots.ok()) return MailboxError(slots.status(), where);
  uint8_t* base = *slots;
  for (size_t k = 0; k < sent; ++k) {
    if (mine[k].size() != kBytes) {
      return absl::InternalError(absl::StrCat(where, ": this writer's descriptor has ",
                                              mine[k].size(), " bytes, not ", kBytes));
    }
    for (size_t w = 0; w < kWords; ++w) {
      uint64_t v = 0;
      std::memcpy(&v, mine[k].data() + w * 8, 8);
      RETURN_IF_ERROR(MailboxError(writer_->WriteToken(base + k * kBytes + w * 8, v), where));
    }
  }
  send_reqs_.clear();
  recv_reqs_.clear();
  for (size_t k = 0; k < fresh.size(); ++k) {
    send_reqs_.push_back(
        {fresh[k], kMailboxTag, base + (sent == fresh.size() ? k : 0) * kBytes, kBytes});
    recv_reqs_.push_back({fresh[k], kMailboxTag, base + (sent + k) * kBytes, kBytes});
  }
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  const absl::Status s = transport_->RunRound(send_reqs_, recv_reqs_, round_deadline, on_posted);
  if (!s.ok()) {
    if (aborted_.load()) {
      absl::MutexLock lock(&mu_);
      return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
    }
    return absl::Status(s.code(), absl::StrCat(where, " failed: ", s.message()));
  }
  for (size_t k = 0; k < fresh.size(); ++k) {
    std::string d(kBytes, '\0');
    for (size_t w = 0; w < kWords; ++w) {
      auto v = writer_->ReadToken(base + (sent + k) * kBytes + w * 8);
      if (!v.ok()) return MailboxError(v.status(), where);
      std::memcpy(d.data() + w * 8, &*v, 8);
    }
    RETURN_IF_ERROR(MailboxError(writer_->OpenPeerMailbox(fresh[k], d), where));
    mailbox_peers_.insert(fresh[k]);
  }
  if (stats != nullptr) stats->mailbox_exchanged = true;
  return absl::OkStatus();
}

absl::Status Executor::BeginMailboxSync(const BoundPlan& plan) {
  if (direct_failed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", plan.worker, ": plan '", plan.key,
        "': an earlier direct-write sync of this executor failed, so its mailbox sequences may "
        "differ from its peers'; rebuild the transport and the executor (the worker does after "
        "any failed sync)"));
  }
  for (int32_t p : DirectPeers(plan)) ++mailbox_seq_[p];
  mailbox_begun_ = true;
  return absl::OkStatus();
}

absl::Status Executor::AwaitSlot(const std::string& where, int32_t peer, int64_t offset,
                                 uint64_t want, absl::Time deadline, SyncStats& stats) {
  const char* what = offset == kDone ? "done" : "ready";
  const int64_t slot = kSlotsPerPeer * peer + offset;
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  const uint64_t before = mailbox_seen_[slot];
  for (int64_t n = 0;; ++n) {
    auto read = writer_->ReadMailbox(slot);
    if (!read.ok()) return MailboxError(read.status(), where);
    ++stats.mailbox_polls;
    const uint64_t got = *read;
    if (got == want) {
      mailbox_seen_[slot] = got;
      return absl::OkStatus();
    }
    if ((got & kMailboxFailed) != 0) {
      return absl::AbortedError(absl::StrCat(
          where, ": peer ", peer, " failed its part of sync sequence ", got & ~kMailboxFailed,
          " (see its error); this worker's ", what, " token for it never comes"));
    }
    if (got != before) {
      return absl::InternalError(absl::StrCat(
          where, ": peer ", peer, " posted ", what, " sequence ", got,
          " where this worker expects ", want, " (last ", before,
          "): the two sides' syncs diverged (", got > want ? "a future" : "a past", " sequence)"));
    }
    if (aborted_.load()) {
      absl::MutexLock lock(&mu_);
      return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
    }
    if (absl::Now() >= round_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": peer ", peer, " posted no ", what, " token for sync sequence ", want,
          " by the deadline (round_timeout or the sync's; its last: ", got, ")"));
    }
    if (n >= 2000) {
      absl::SleepFor(absl::Microseconds(50));
    } else if (n >= 200) {
      std::this_thread::yield();
    }
  }
}

absl::Status Executor::MailboxReady(const BoundPlan& plan, absl::Time deadline,
                                    const std::function<void()>& on_posted, SyncStats& stats) {
  const std::string where = TokenWhere(plan, /*ready=*/true);
  bool posted = false;
  auto post_once = [&] {
    if (posted) return;
    posted = true;
    if (on_posted) on_posted();
  };
  RETURN_IF_ERROR(EnsureMailboxes(plan, deadline, post_once, &stats));
  RETURN_IF_ERROR(BeginMailboxSync(plan));
  const int64_t me = plan.worker;
  // To every writer of this worker: the fingerprint, then the sequence (a
  // writer that sees the sequence reads this sync's fingerprint).
  for (int32_t w : plan.direct_written_by) {
    RETURN_IF_ERROR(MailboxError(
        writer_->Post(w, kSlotsPerPeer * me + kReadyFingerprint, plan.ready_token), where));
    RETURN_IF_ERROR(
        MailboxError(writer_->Post(w, kSlotsPerPeer * me + kReadySeq, mailbox_seq_[w]), where));
    ready_posted_.insert(w);
  }
  post_once();
  for (int32_t r : plan.direct_write_to) {
    RETURN_IF_ERROR(AwaitSlot(where, r, kReadySeq, mailbox_seq_[r], deadline, stats));
    auto got = writer_->ReadMailbox(kSlotsPerPeer * r + kReadyFingerprint);
    if (!got.ok()) return MailboxError(got.status(), where);
    auto want = plan.expected_ready_tokens.find(r);
    if (want == plan.expected_ready_tokens.end() || want->second != *got) {
      return absl::AbortedError(absl::StrCat(
          where, ": worker ", r,
          "'s registered buffers differ from the ones this worker mapped for it (its owner "
          "registered again after the controller assigned the sync); nothing was written to it, "
          "the "
          "next sync uses the new registration"));
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::MailboxDone(const BoundPlan& plan, absl::Time deadline, SyncStats& stats) {
  const std::string where = TokenWhere(plan, /*ready=*/false);
  const int64_t me = plan.worker;
  // The puts were fenced: a receiver that reads this may read their bytes.
  for (int32_t r : plan.direct_write_to) {
    RETURN_IF_ERROR(
        MailboxError(writer_->Post(r, kSlotsPerPeer * me + kDone, mailbox_seq_[r]), where));
    done_posted_.insert(r);
  }
  for (int32_t w : plan.direct_written_by) {
    RETURN_IF_ERROR(AwaitSlot(where, w, kDone, mailbox_seq_[w], deadline, stats));
  }
  return absl::OkStatus();
}

void Executor::PostMailboxFailure(const BoundPlan& plan) {
  if (!mailbox_sync_) return;
  direct_failed_ = true;
  const int64_t me = plan.worker;
  // This sync's sequence with `p`, whether or not it began here.
  auto seq = [&](int32_t p) { return mailbox_seq_[p] + (mailbox_begun_ ? 0 : 1); };
  // Only where this worker's token never came: a token already posted
  // stands (a receiver that has its done token has every put byte; a writer
  // that has its ready token may write), and overwriting it would make a
  // peer that has not read it yet fail a part that succeeded.
  for (int32_t r : plan.direct_write_to) {
    if (mailbox_peers_.count(r) == 0 || done_posted_.count(r) != 0) continue;
    writer_->Post(r, kSlotsPerPeer * me + kDone, kMailboxFailed | seq(r)).IgnoreError();
    // A receiver hashing this worker's parts polls this one.
    writer_->Post(r, kSlotsPerPeer * me + kParts, kMailboxFailed | seq(r)).IgnoreError();
  }
  for (int32_t w : plan.direct_written_by) {
    if (mailbox_peers_.count(w) == 0 || ready_posted_.count(w) != 0) continue;
    writer_->Post(w, kSlotsPerPeer * me + kReadySeq, kMailboxFailed | seq(w)).IgnoreError();
  }
  // Every phase gate waiting for this worker opens (its high bit exceeds
  // any phase value).
  for (int32_t p : DirectPeers(plan)) {
    if (mailbox_peers_.count(p) == 0) continue;
    writer_->Post(p, kSlotsPerPeer * me + kPhase, kMailboxFailed | seq(p)).IgnoreError();
  }
}

}  // namespace wsync::exec
