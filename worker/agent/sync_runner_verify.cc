// SyncRunner: the verify mode's passes (docs/staging.md, "Verify";
// worker/exec/verify_pass.h).
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/agent/sync_runner.h"

namespace wsync::agent {

absl::Status SyncRunner::CorruptForTest() {
  const std::string& name = options_.test_corrupt_after_sync;
  const exec::RegisteredBuffer* b = registry_.Find(exec::BufferSide::kDestination, name);
  if (b == nullptr || b->bytes <= 0) {
    return absl::NotFoundError(
        absl::StrCat("--test_corrupt_after_sync: no registered tensor '", name, "' here"));
  }
  if (options_.backend->memory_space() != transport::MemorySpace::kHost) {
    return absl::UnimplementedError("--test_corrupt_after_sync: host memory only");
  }
  static_cast<unsigned char*>(b->data)[0] ^= 0xff;
  spdlog::warn("TEST FAILPOINT --test_corrupt_after_sync: flipped the first byte of '{}'", name);
  return absl::OkStatus();
}

absl::Status SyncRunner::VerifyInto(const exec::BoundPlan& plan, exec::VerifySides sides,
                                    v1::ReportResultRequest* r) {
  bool sends = false, receives = false;
  for (const exec::BoundRound& round : plan.rounds) {
    sends = sends || (sides.sends && !round.sends.empty());
    receives = receives || (sides.receives && !round.recvs.empty()) ||
               (sides.locals && !round.copy_buckets.empty());
  }
  if (!sends && !receives) return absl::OkStatus();  // nothing of it on these sides
  if (receives && !options_.test_corrupt_after_sync.empty()) {
    if (absl::Status s = CorruptForTest(); !s.ok() && !absl::IsNotFound(s)) return s;
  }
  if (verify_ops_ == nullptr) {
    auto ops = options_.backend->NewDataOps();
    if (!ops.ok()) return ops.status();
    verify_ops_ = std::move(*ops);
  }
  auto v = exec::VerifyPass(plan, verify_ops_.get(), sides);
  if (!v.ok()) return v.status();
  ++verify_passes_;
  r->set_verify_pass(true);
  for (const exec::BucketChecksum& c : v->hashes) {
    v1::BucketChecksum* out = r->add_verify_checksums();
    out->set_bucket(c.bucket);
    out->set_hash(c.hash);
    out->set_sent(c.sent);
  }
  for (const exec::VerifyNote& n : v->notes) {
    v1::VerifyNote* out = r->add_verify_notes();
    out->set_bucket(n.bucket);
    out->set_reason(n.reason);
    out->set_mismatch(n.mismatch);
  }
  r->set_verify_local_buckets(r->verify_local_buckets() + v->local_buckets);
  r->set_verify_local_bytes(r->verify_local_bytes() + v->local_bytes);
  return absl::OkStatus();
}

absl::Status SyncRunner::VerifyCommitted(const v1::SyncAssignment& a, v1::ReportResultRequest* r) {
  const std::shared_ptr<const v1::Plan> part = parts_.Get(PartIdOf(a));
  if (part == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", a.worker(), ": verify after the commit: the op list of ",
                     PartIdOf(a), " is no longer cached (--parts_cache_bytes)"));
  }
  RETURN_IF_ERROR(RefreshRegistry());
  // The live tensors this time, not the shadows the sync wrote.
  auto live = exec::BindPlan(*part, a.worker(), registry_, options_.backend->memory_space());
  if (!live.ok()) return live.status();
  return VerifyInto(**live, exec::VerifySides{false, true, true}, r);
}

}  // namespace wsync::agent
