// Verify mode (docs/staging.md, "Verify"): after a sync (after the commit of
// a staged one), what a worker's memory holds for each bucket of its bound
// plan, hashed in the wire layout, so that the controller can compare every
// live destination with its source.
//
//   * A sent network bucket: its sources packed exactly as the sender packs
//     them (BoundRound::pack, cast to the wire dtype, block fp8 quantized),
//     or the tensor range of a zero-copy bucket.
//   * A received network bucket: its live destination views packed back
//     into the wire layout (the unpack items reversed). Only where the
//     unpack wrote the wire bytes as they are: a piece cast on receive
//     (wire dtype != destination dtype), reduced or block-fp8 quantized on
//     receive cannot match the wire byte for byte, so the bucket is noted
//     not verifiable, with the reason, and never hashed.
//   * A local (COPY) bucket: its sources and its destinations both packed
//     in the destination dtype (the conversion the copy made) and compared
//     here; one with quantized or reduced pieces is noted not verifiable.
//
// A bucket's verify hash covers the bytes its pieces occupy in the bucket
// (maximal runs of them, so padding between pieces, which the two sides
// leave unset, never counts): Finish(sum over runs of
// Term(Hash(run), run offset), covered bytes) with common/chunk_hash.h.
// Both sides cover the same bytes whatever way their items cut them.
// Everything goes through DataOps (Pack, Checksum, AllocateStaging), so the
// host and CUDA backends run the same code.
#ifndef WSYNC_WORKER_EXEC_VERIFY_PASS_H_
#define WSYNC_WORKER_EXEC_VERIFY_PASS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/executor.h"
#include "worker/plane/data_ops.h"

namespace wsync::exec {

struct VerifyNote {
  int64_t bucket = 0;
  std::string reason;
  bool mismatch = false;  // a local copy compared and found different
};

struct VerifyResult {
  std::vector<BucketChecksum> hashes;  // network buckets, `sent` as in SyncStats
  std::vector<VerifyNote> notes;
  int32_t local_buckets = 0;  // local copies compared equal
  int64_t local_bytes = 0;    // their destination bytes
};

struct VerifySides {
  bool sends = false;
  bool receives = false;
  bool locals = false;
};

// Hashes the buckets of `plan` on the `sides` asked for. The memory must be
// quiescent (the sync finished). Errors name the round and bucket.
absl::StatusOr<VerifyResult> VerifyPass(const BoundPlan& plan, DataOps* ops, VerifySides sides);

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_VERIFY_PASS_H_
