// SyncCoordinator: the two phases of staged syncs (docs/staging.md). Phase 1
// ends when every participant reported: senders success, receivers `staged`
// (the new version in their shadow, the old one still serving). The bucket
// checksums are compared; then the commit is decided, once, and CommitSync
// goes to every receiver. Any failure before the decision fails the sync and
// every receiver rolls back (AbortSync, or its lease ending). After the
// decision nothing rolls back: a receiver lost, failed or silent is listed
// in SyncStatus.uncommitted and the sync succeeds once the others confirmed.
// CommitSync goes out in waves of replicas (sync_rollout.cc).
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/plan_pieces.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

bool SyncCoordinator::SameStagedReport(const Participant& p, const v1::ReportResultRequest& req) {
  if (p.bytes_done != req.bytes_done() ||
      p.checksums.size() != static_cast<size_t>(req.checksums_size())) {
    return false;
  }
  for (size_t i = 0; i < p.checksums.size(); ++i) {
    const v1::BucketChecksum& a = p.checksums[i];
    const v1::BucketChecksum& b = req.checksums(static_cast<int>(i));
    if (a.bucket() != b.bucket() || a.hash() != b.hash() || a.sent() != b.sent()) return false;
  }
  return true;
}

bool SyncCoordinator::StagedReportLocked(SyncRecord& sync, Participant& p,
                                         const v1::ReportResultRequest& req) {
  if (sync.staging.mode() == v1::STAGING_IN_PLACE) return false;
  v1::SyncStatus& s = sync.status;
  auto protocol_error = [&](const std::string& what) {
    p.done = true;
    s.set_workers_done(s.workers_done() + 1);
    ++sync.changes;
    FinishLocked(sync, v1::SYNC_FAILED, static_cast<int32_t>(absl::StatusCode::kInternal),
                 absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "] ", what),
                 p.worker, -1, -1, -1);
    return true;
  };
  if (req.staged() && p.staged) {
    // The same report again, before or after the decision: a worker retrying
    // a delivery whose answer it lost. Anything else is a protocol error.
    if (SameStagedReport(p, req)) return true;
    return protocol_error("reported staged twice, with other figures");
  }
  if (s.commit_decided()) {
    if (!p.stages) return protocol_error("reported again after the commit decision");
    if (req.code() == 0 && (req.commit_held() || req.commit_admitted())) {
      HeldReportLocked(sync, p, req);
      return true;
    }
    p.done = true;
    p.held = false;
    s.set_workers_done(s.workers_done() + 1);
    s.set_max_commit_seconds(std::max(s.max_commit_seconds(), req.commit_seconds()));
    ++sync.changes;
    if (req.code() != 0 || !req.committed()) {
      const std::string why = req.message().empty() ? "did not commit" : req.message();
      s.add_uncommitted(
          absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]: ", why));
      NoteServedLocked(sync, p, /*committed=*/false);
    } else {
      p.committed = true;
      NoteServedLocked(sync, p, /*committed=*/true);
      ++sync.commits_confirmed;
      TestCrashPointLocked(sync, sync.commits_confirmed);
    }
    MaybeFinishCommitLocked(sync);
    return true;
  }
  if (req.staged()) {
    if (req.code() != 0) return protocol_error("reported staged with an error");
    if (!p.stages) return protocol_error("reported staged but its part writes nothing");
    p.staged = true;
    p.bytes_done = req.bytes_done();
    p.checksums.assign(req.checksums().begin(), req.checksums().end());
    s.set_workers_staged(s.workers_staged() + 1);
    RecordControlPath(sync, p, req);
    ++sync.changes;
    MaybeCommitLocked(sync);
    return true;
  }
  if (req.code() == 0 && p.stages) {
    return protocol_error("reported success without staging (a staged sync's receiver)");
  }
  if (req.code() == 0) p.checksums.assign(req.checksums().begin(), req.checksums().end());
  return false;
}

absl::Status SyncCoordinator::VerifyChecksumsLocked(SyncRecord& sync, int32_t* cause) {
  *cause = -1;
  const v1::Plan* plan = sync.plan.get();
  if (plan == nullptr) return absl::InternalError("checksum: the sync keeps no plan");
  // Every network bucket of the plan, by id: exactly one checksum from its
  // sender and one from its receiver (a count alone would let a duplicate
  // make up for a missing one).
  struct Reported {
    const v1::Bucket* bucket = nullptr;
    std::vector<std::pair<uint64_t, const Participant*>> sent, received;
  };
  std::map<int64_t, Reported> by_id;
  for (const v1::Bucket& b : plan->buckets()) {
    if (b.transport() == v1::TRANSPORT_NETWORK) by_id[b.id()].bucket = &b;
  }
  auto who = [&](const Participant& p) {
    return absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]");
  };
  auto worker_name = [&](int32_t w) {
    for (const Participant& p : sync.parts) {
      if (p.worker == w) return who(p);
    }
    return absl::StrCat("worker ", w);
  };
  auto bucket_name = [&](const v1::Bucket& b) { return BucketPieceNames(*plan, b); };
  for (const Participant& p : sync.parts) {
    for (const v1::BucketChecksum& c : p.checksums) {
      auto it = by_id.find(c.bucket());
      if (it == by_id.end()) {
        *cause = p.worker;
        return absl::FailedPreconditionError(
            absl::StrCat("checksum: ", who(p), " reports a ", c.sent() ? "sent" : "received",
                         " checksum of bucket ", c.bucket(), ", not a network bucket of plan '",
                         plan->key(), "'"));
      }
      (c.sent() ? it->second.sent : it->second.received).emplace_back(c.hash(), &p);
    }
  }
  int32_t verified = 0;
  for (const auto& [id, r] : by_id) {
    const v1::Bucket& b = *r.bucket;
    const std::string where =
        absl::StrCat("bucket ", id, " (tensor ", bucket_name(b), ") from ", worker_name(b.sender()),
                     " to ", worker_name(b.receiver()));
    for (const auto* side : {&r.sent, &r.received}) {
      const bool sent = side == &r.sent;
      const int32_t owner = sent ? b.sender() : b.receiver();
      if (side->size() == 1 && side->front().second->worker == owner) continue;
      *cause = side->empty() ? owner : side->front().second->worker;
      return absl::FailedPreconditionError(absl::StrCat(
          "checksum: ", where, " has ", side->size(), " ", sent ? "sent" : "received", " checksums",
          side->empty() ? "" : absl::StrCat(" (from ", who(*side->front().second), ")"),
          ", expected exactly one from its ", sent ? "sender" : "receiver",
          "; nothing committed, every receiver stays on its version"));
    }
    const auto& [sent_hash, from] = r.sent.front();
    const auto& [received_hash, to] = r.received.front();
    if (sent_hash != received_hash) {
      *cause = to->worker;
      return absl::DataLossError(absl::StrCat(
          "checksum mismatch: bucket ", id, " (tensor ", bucket_name(b), ") sent by ", who(*from),
          " hashed ", absl::Hex(sent_hash, absl::kZeroPad16), ", received by ", who(*to),
          " hashed ", absl::Hex(received_hash, absl::kZeroPad16),
          "; nothing committed, every receiver stays on its version"));
    }
    ++verified;
  }
  sync.status.set_buckets_verified(verified);
  return absl::OkStatus();
}

void SyncCoordinator::MaybeCommitLocked(SyncRecord& sync) {
  if (sync.finished() || sync.status.commit_decided()) return;
  for (const Participant& p : sync.parts) {
    if (!(p.done || p.staged)) return;
  }
  if (sync.first_failure >= 0) {
    SettleLocked(sync);  // a failure about peers awaited its cause
    return;
  }
  if (sync.staging.checksums()) {
    int32_t cause = -1;
    if (absl::Status st = VerifyChecksumsLocked(sync, &cause); !st.ok()) {
      FinishLocked(sync, v1::SYNC_FAILED, static_cast<int32_t>(st.code()),
                   std::string(st.message()), cause, -1, -1, -1);
      return;
    }
  }
  sync.status.set_commit_decided(true);
  sync.decided = absl::Now();
  ++sync.changes;
  // Rolling waves (sync_rollout.cc): the first wave, saved with the decision.
  GroupReplicasLocked(sync);
  const std::vector<size_t> first_wave = MarkNextWaveLocked(sync);
  // Durable before any receiver hears it: a restarted controller resumes the
  // commit (sync_decided.cc). Not durable: no receiver heard anything yet,
  // so the sync fails and every receiver rolls back.
  if (absl::Status saved = PersistLocked(); !saved.ok()) {
    sync.status.set_commit_decided(false);
    sync.decided = absl::InfinitePast();
    FinishLocked(sync, v1::SYNC_FAILED, static_cast<int32_t>(saved.code()),
                 absl::StrCat("the commit decision could not be saved (", saved.message(),
                              "): nothing was committed, every receiver keeps version ",
                              sync.status.version() - 1, " or what it served before"),
                 -1, -1, -1, -1);
    return;
  }
  PushCommitsLocked(sync, first_wave);
  TestCrashPointLocked(sync, 0);
  MaybeFinishCommitLocked(sync);  // no receiver at all: done
}

void SyncCoordinator::UncommittedLocked(SyncRecord& sync, Participant& p, const std::string& why) {
  if (p.done) return;
  p.done = true;
  v1::SyncStatus& s = sync.status;
  s.set_workers_done(s.workers_done() + 1);
  s.add_uncommitted(
      absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]: ", why));
  NoteServedLocked(sync, p, /*committed=*/false);
  ++sync.changes;
}

void SyncCoordinator::MaybeFinishCommitLocked(SyncRecord& sync) {
  if (sync.finished()) return;
  AdvanceRolloutLocked(sync);  // the next wave, once this one is done
  RefreshRolloutLocked(sync);
  for (const Participant& p : sync.parts) {
    if (!p.done) return;
  }
  if (sync.status.uncommitted_size() > 0) {
    spdlog::warn("[controller] sync {}: committed, but not by {}", sync.status.sync_id(),
                 absl::StrJoin(sync.status.uncommitted(), "; "));
  }
  if (FinishVerifyLocked(sync)) return;  // verify mode: a mismatch fails it
  FinishLocked(sync, v1::SYNC_SUCCEEDED, 0, "", -1, -1, -1, -1);
}

}  // namespace wsync::controller
