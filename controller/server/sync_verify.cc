// SyncCoordinator: the verify mode (docs/staging.md, "Verify"). After the
// commit (staged) or the run (in place), every receiver hashed what its live
// destination tensors hold for each bucket it received, every sender what
// its sources hold (worker/exec/verify_pass.h); here each network bucket's
// two hashes are compared. Local copies were compared on their worker,
// which reports the count and any mismatch. A bucket a receiver could not
// compare (a transform on receive) is counted and named, never claimed.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/plan_pieces.h"
#include "controller/server/sync_coordinator.h"

namespace wsync::controller {
namespace {

constexpr int kNamedNotVerifiable = 16;  // SyncStatus.not_verifiable's bound

}  // namespace

void SyncCoordinator::KeepVerifyPass(Participant& p, const v1::ReportResultRequest& req) {
  if (!req.verify_pass()) return;
  // A staged receiver that also sends reports twice: its sources with the
  // staged report, its live destinations with the committed one.
  p.verify_pass = true;
  p.verify_checksums.insert(p.verify_checksums.end(), req.verify_checksums().begin(),
                            req.verify_checksums().end());
  p.verify_notes.insert(p.verify_notes.end(), req.verify_notes().begin(), req.verify_notes().end());
  p.verify_local_buckets += req.verify_local_buckets();
  p.verify_local_bytes += req.verify_local_bytes();
}

absl::Status SyncCoordinator::CompareVerifyLocked(SyncRecord& sync, int32_t* receiver) {
  *receiver = -1;
  const v1::Plan* plan = sync.plan.get();
  v1::SyncStatus& s = sync.status;
  if (plan == nullptr) {
    // Restored after a controller restart (the state file keeps no plan and
    // no phase-1 hashes): nothing can be compared; said, not failed.
    s.set_verify_not_verifiable(s.workers_total());
    s.add_not_verifiable(
        "every bucket: the controller restarted during the commit and keeps no plan or source "
        "hashes of this sync");
    return absl::OkStatus();
  }
  struct Sides {
    std::vector<std::pair<uint64_t, const Participant*>> sent, received;
    const v1::VerifyNote* note = nullptr;
  };
  std::map<int64_t, Sides> by_id;
  std::map<int64_t, const v1::Bucket*> buckets;
  for (const v1::Bucket& b : plan->buckets()) buckets[b.id()] = &b;
  auto who = [&](const Participant& p) {
    return absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker, "]");
  };
  auto worker_name = [&](int32_t w) {
    for (const Participant& p : sync.parts) {
      if (p.worker == w) return who(p);
    }
    return absl::StrCat("worker ", w);
  };
  auto tensor = [&](int64_t id) {
    auto it = buckets.find(id);
    return it == buckets.end() ? std::string("?") : BucketPieceNames(*plan, *it->second);
  };
  int32_t verified = 0, not_verifiable = 0;
  int64_t bytes = 0;
  auto skip = [&](const Participant& p, const v1::VerifyNote& n) {
    ++not_verifiable;
    if (s.not_verifiable_size() < kNamedNotVerifiable) {
      s.add_not_verifiable(absl::StrCat("bucket ", n.bucket(), " (tensor ", tensor(n.bucket()),
                                        ") on ", who(p), ": ", n.reason()));
    }
  };
  for (const Participant& p : sync.parts) {
    verified += p.verify_local_buckets;
    bytes += p.verify_local_bytes;
    for (const v1::BucketChecksum& c : p.verify_checksums) {
      Sides& side = by_id[c.bucket()];
      (c.sent() ? side.sent : side.received).emplace_back(c.hash(), &p);
    }
    for (const v1::VerifyNote& n : p.verify_notes) {
      auto b = buckets.find(n.bucket());
      const bool network = b != buckets.end() && b->second->transport() == v1::TRANSPORT_NETWORK;
      if (n.mismatch()) {
        *receiver = p.worker;
        return absl::DataLossError(absl::StrCat("verify: bucket ", n.bucket(), " (tensor ",
                                                tensor(n.bucket()), ") on ", who(p), ": ",
                                                n.reason()));
      }
      if (network) {
        by_id[n.bucket()].note = &n;
      } else {
        skip(p, n);
      }
    }
  }
  for (const v1::Bucket& b : plan->buckets()) {
    if (b.transport() != v1::TRANSPORT_NETWORK) continue;
    const Sides& side = by_id[b.id()];
    const std::string where =
        absl::StrCat("bucket ", b.id(), " (tensor ", tensor(b.id()), ") from ",
                     worker_name(b.sender()), " to ", worker_name(b.receiver()));
    const Participant* to_part = nullptr;
    for (const Participant& p : sync.parts) {
      if (p.worker == b.receiver()) to_part = &p;
    }
    if (s.commit_decided() && to_part != nullptr && to_part->stages && !to_part->committed) {
      // Listed uncommitted (lost, failed, held or cut off before its wave):
      // it serves nothing of this version, there is nothing to compare.
      ++not_verifiable;
      if (s.not_verifiable_size() < kNamedNotVerifiable) {
        s.add_not_verifiable(absl::StrCat(where, ": its receiver did not commit"));
      }
      continue;
    }
    if (side.note != nullptr && side.received.empty()) {
      for (const Participant& p : sync.parts) {
        if (p.worker == b.receiver()) skip(p, *side.note);
      }
      continue;
    }
    if (side.sent.size() != 1 || side.received.size() != 1 ||
        side.sent.front().second->worker != b.sender() ||
        side.received.front().second->worker != b.receiver()) {
      *receiver = side.received.empty() ? b.receiver() : side.received.front().second->worker;
      return absl::FailedPreconditionError(absl::StrCat(
          "verify: ", where, " has ", side.sent.size(), " source and ", side.received.size(),
          " destination hashes, expected one from its sender and one from its receiver (a "
          "verify pass failed or did not run: see the worker's log)"));
    }
    const auto& [sent_hash, from] = side.sent.front();
    const auto& [received_hash, to] = side.received.front();
    if (sent_hash != received_hash) {
      *receiver = to->worker;
      return absl::DataLossError(
          absl::StrCat("verify: ", where, ": the live destination on ", who(*to), " hashes ",
                       absl::Hex(received_hash, absl::kZeroPad16), ", its source on ", who(*from),
                       " ", absl::Hex(sent_hash, absl::kZeroPad16)));
    }
    ++verified;
    bytes += b.bytes();
  }
  s.set_verify_buckets(verified);
  s.set_verify_bytes(bytes);
  s.set_verify_not_verifiable(not_verifiable);
  return absl::OkStatus();
}

bool SyncCoordinator::FinishVerifyLocked(SyncRecord& sync) {
  v1::SyncStatus& s = sync.status;
  int32_t passes = 0;
  for (const Participant& p : sync.parts) passes += p.verify_pass ? 1 : 0;
  s.set_verify_passes(passes);
  if (!sync.staging.verify()) return false;
  int32_t receiver = -1;
  const absl::Status st = CompareVerifyLocked(sync, &receiver);
  if (st.ok()) return false;
  std::string error(st.message());
  if (s.commit_decided()) {
    for (Participant& p : sync.parts) {
      if (p.worker != receiver) continue;
      p.committed = false;
      NoteServedLocked(sync, p, /*committed=*/false);  // routers must not pick it for V
      s.add_uncommitted(
          absl::StrCat(workers_->Describe(p.lease_id), " [worker ", p.worker,
                       "]: its live tensors differ from their sources after the commit (verify)"));
    }
    absl::StrAppend(&error, "; version ", s.version(),
                    " was committed, but that replica must not serve until it syncs version ",
                    s.version(), " again (listed uncommitted)");
  } else {
    absl::StrAppend(&error, "; that replica's live tensors are not version ", s.version(),
                    ": it must not serve until it syncs again");
  }
  spdlog::error("[controller] sync {}: {}", s.sync_id(), error);
  FinishLocked(sync, v1::SYNC_FAILED, static_cast<int32_t>(st.code()), error, receiver, -1, -1, -1);
  return true;
}

}  // namespace wsync::controller
