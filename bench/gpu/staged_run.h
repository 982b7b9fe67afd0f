// Staged syncs in the data-plane bench (docs/staging.md). A receiver's part
// binds to shadow copies of its destination buffers (agent::ShadowSet, as
// wsync-worker does); the executor fills them while the live buffers keep
// their bytes; the commit then copies the written views in. The commit is the
// pause an inference engine sees; in place, the whole run is.
//
// Bucket checksums (Executor::set_checksums) are published per worker through
// the bench's key-value store and compared on worker 0, bucket by bucket, as
// the controller compares them before a commit.
#ifndef WSYNC_BENCH_GPU_STAGED_RUN_H_
#define WSYNC_BENCH_GPU_STAGED_RUN_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/gpu/slabs.h"
#include "worker/agent/shadow_set.h"
#include "worker/agent/weight_arenas.h"
#include "worker/exec/buffer_registry.h"
#include "worker/exec/executor.h"
#include "worker/plane/backend.h"
#include "worker/plane/kv_store.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::bench {

// "in_place", "host_shadow" or "device_shadow".
absl::StatusOr<v1::StagingMode> ParseStagingMode(const std::string& name);
const char* StagingModeName(v1::StagingMode mode);

// One worker's binding target for a staged (or in-place) run.
struct StagedPart {
  // Null when the part writes in place: the mode is in place, or the
  // worker writes nothing (a sender only).
  std::unique_ptr<agent::ShadowSet> shadows;
  // What the part binds to: `live`, or live with the shadows in place of
  // the destination buffers. Points into `shadows` or at the caller's `live`.
  const exec::BufferRegistry* registry = nullptr;
};

// Shadows of `worker`'s written destination buffers of `rank_plan` in
// `mode`, allocated and filled from `live` (no budget).
// `arenas` (may be null): the worker's weight arenas; a part whose
// destinations lie in one commits by swapping (docs/commit-swap.md).
absl::StatusOr<StagedPart> PrepareStaging(v1::StagingMode mode, const v1::Plan& rank_plan,
                                          int worker, plane::Backend* backend,
                                          const exec::BufferRegistry& live,
                                          agent::WeightArenas* arenas = nullptr);

// --commit swap: `slab` for `need` carved from one new weight arena of
// `backend` (the slab holds it), added to `arenas`.
absl::Status MakeArenaSlab(const std::map<std::string, BufferNeed>& need, plane::Backend& backend,
                           agent::WeightArenas& arenas, Slab& slab);

// --commit flip (docs/commit-flip.md): `slab` carved from the first arena of
// a new flip pair of `backend` (the slab holds it), added to `arenas`.
absl::Status MakeFlipSlab(const std::map<std::string, BufferNeed>& need, plane::Backend& backend,
                          agent::WeightArenas& arenas, Slab& slab);

// --commit flip, after `set` committed: what the worker and the owner then
// do, in the bench. The worker's part (untimed, as the tensor table's rebase
// and the COMMITTED event are not a pause of the owner, which serves V-1
// meanwhile): the destination buffers of `slab` move in `live` onto the arena
// flipped onto, and the flip is recorded. The owner's part, the only pause
// of a flip commit: every pointer of `owner` (one per destination buffer,
// as an engine holds them) moves onto that arena, and it acknowledges
// (WeightArenas::Ack); its seconds go to `owner_switch_s`. INTERNAL when
// `set` did not flip.
absl::Status FollowFlip(const agent::ShadowSet& set, agent::WeightArenas& arenas, const Slab& slab,
                        exec::BufferRegistry& live, std::vector<void*>& owner,
                        double* owner_switch_s);

// --commit flip: one RESULT line of `worker`'s flips: the owner's switch
// (median and max seconds, pointers moved) beside the worker's commit.
void ReportFlip(const std::string& model, const std::string& mode, int worker,
                const std::vector<double>& owner_switch_s, const std::vector<double>& commit_s,
                size_t pointers);

// --commit flip: stages the next sync of `worker` (ShadowSet::Prepare over
// `live`, which the last flip moved); the caller binds the part again.
absl::Status Restage(agent::ShadowSet& set, v1::StagingMode mode, const v1::Plan& rank_plan,
                     int worker, const exec::BufferRegistry& live);

// Publishes `checksums` of `worker` under `tag`.
absl::Status PublishChecksums(transport::KvStore& store, const std::string& tag, int worker,
                              const std::vector<exec::BucketChecksum>& checksums);

// Reads every worker's published checksums and compares each network bucket
// of `plan` (sender != receiver): exactly one hash from its sender and one
// from its receiver, equal. Returns the buckets compared; DATA_LOSS naming
// the bucket, its sender and receiver on a mismatch, FAILED_PRECONDITION for
// one missing or doubled.
absl::StatusOr<int> CompareChecksums(transport::KvStore& store, const std::string& tag, int workers,
                                     const v1::Plan& plan);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_STAGED_RUN_H_
