// SyncCoordinator: the two phases of staged syncs (docs/staging.md). Phase 1
// ends when every participant reported: senders success, receivers `staged`
// (the new version in their shadow, the old one still serving). The bucket
// checksums are compared; then the commit is decided, once, and CommitSync
// goes to every receiver. Any failure before the decision fails the sync and
// every receiver rolls back (AbortSync, or its lease ending). After the
// decision nothing rolls back: a receiver lost, failed or silent is listed
// in SyncStatus.uncommitted and the sync succeeds once the others confirmed.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/plan_names.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {

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
  if (s.commit_decided()) {
    if (!p.stages) return protocol_error("reported again after the commit decision");
    p.done = true;
    s.set_workers_done(s.workers_done() + 1);
    s.set_max_commit_seconds(std::max(s.max_commit_seconds(), req.commit_seconds()));
    ++sync.changes;
    if (req.code() != 0 || !req.committed()) {
      const std::string why = req.message().empty() ? "did not commit" : req.message();
      s.add_uncommitted(
          absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]: ", why));
    } else {
      ++sync.commits_confirmed;
      TestCrashPointLocked(sync, sync.commits_confirmed);
    }
    MaybeFinishCommitLocked(sync);
    return true;
  }
  if (req.staged()) {
    if (req.code() != 0) return protocol_error("reported staged with an error");
    if (!p.stages) return protocol_error("reported staged but its part writes nothing");
    if (p.staged) return protocol_error("reported staged twice");
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
  // bucket -> (hash, worker) as sent; then every received one against it.
  std::map<int64_t, std::pair<uint64_t, const Participant*>> sent;
  for (const Participant& p : sync.parts) {
    for (const v1::BucketChecksum& c : p.checksums) {
      if (c.sent()) sent[c.bucket()] = {c.hash(), &p};
    }
  }
  const v1::Plan* plan = sync.plan.get();
  auto bucket_name = [&](int64_t id) {
    if (plan == nullptr || id < 0 || id >= plan->buckets_size()) return std::string("?");
    const v1::Bucket& b = plan->buckets(static_cast<int>(id));
    if (b.pieces().empty()) return std::string("?");
    std::string names = PlanNameOrIndex(*plan, b.pieces(0).tensor_name());
    if (b.pieces_size() > 1) absl::StrAppend(&names, " and ", b.pieces_size() - 1, " more pieces");
    return names;
  };
  int32_t verified = 0;
  size_t received = 0;
  for (const Participant& p : sync.parts) {
    for (const v1::BucketChecksum& c : p.checksums) {
      if (c.sent()) continue;
      ++received;
      auto it = sent.find(c.bucket());
      const std::string receiver =
          absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]");
      if (it == sent.end()) {
        *cause = p.worker;
        return absl::FailedPreconditionError(
            absl::StrCat("checksum: bucket ", c.bucket(), " (tensor ", bucket_name(c.bucket()),
                         ") received by ", receiver, " has no checksum from its sender"));
      }
      if (it->second.first != c.hash()) {
        *cause = p.worker;
        const Participant& from = *it->second.second;
        return absl::DataLossError(absl::StrCat(
            "checksum mismatch: bucket ", c.bucket(), " (tensor ", bucket_name(c.bucket()),
            ") sent by ", workers_->Describe(from.lease_id), " [worker ", from.worker, "] hashed ",
            absl::Hex(it->second.first, absl::kZeroPad16), ", received by ", receiver, " hashed ",
            absl::Hex(c.hash(), absl::kZeroPad16),
            "; nothing committed, every receiver stays on its version"));
      }
      ++verified;
    }
  }
  if (received != sent.size()) {
    *cause = -1;
    return absl::FailedPreconditionError(absl::StrCat("checksum: ", sent.size(),
                                                      " buckets were sent with checksums, ",
                                                      received, " received with them"));
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
  ++sync.changes;
  // Durable before any receiver hears it: a restarted controller resumes the
  // commit (sync_decided.cc). A failed save is logged; the commit goes on.
  PersistLocked();
  // Test only: the first N receivers hear it, then the process dies.
  const int32_t crash_after = config_.test_crash_after_commits;
  int32_t sent = 0;
  for (const Participant& p : sync.parts) {
    if (!p.staged || (crash_after >= 0 && sent >= crash_after)) continue;
    v1::Assignment a;
    a.mutable_commit()->set_sync_id(sync.status.sync_id());
    // A lost receiver: WorkerLost lists it uncommitted.
    workers_->Push(p.lease_id, std::move(a));
    ++sent;
  }
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
  ++sync.changes;
}

void SyncCoordinator::MaybeFinishCommitLocked(SyncRecord& sync) {
  if (sync.finished()) return;
  for (const Participant& p : sync.parts) {
    if (!p.done) return;
  }
  if (sync.status.uncommitted_size() > 0) {
    spdlog::warn("[controller] sync {}: committed, but not by {}", sync.status.sync_id(),
                 absl::StrJoin(sync.status.uncommitted(), "; "));
  }
  FinishLocked(sync, v1::SYNC_SUCCEEDED, 0, "", -1, -1, -1, -1);
}

}  // namespace wsync::controller
