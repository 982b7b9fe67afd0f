// Staged syncs (docs/staging.md): which destination buffers a worker's part
// writes as a receiver, and how much of each. A receiver's shadow copy of a
// buffer covers bytes [0, extent) (the highest byte any write reaches), so
// the controller (Plan, the budget check) and the worker (allocation) compute
// the same sizes from the same plan. The commit copies back only the views
// written (ShadowWrites), never the rest of [0, extent).
#ifndef WSYNC_COMMON_SHADOW_EXTENTS_H_
#define WSYNC_COMMON_SHADOW_EXTENTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "wsync/v1/plan.pb.h"

namespace wsync {

// A worker registers with this capability when it runs staged syncs (writes
// shadows, waits for the commit decision). The controller refuses a staged
// transfer over a receiver without it: such a worker would write in place.
inline constexpr char kStagedSyncsCapability[] = "staged_syncs";

// Plan buffer name ("<group>/<name>") -> extent in bytes, for every
// DESTINATION_BUFFER view `worker` writes in `plan` (a whole plan or the
// worker's part): pieces of the buckets it receives (network and local, not
// the inputs of a reduce or quantize), its reduces' and quantizes'
// destinations. INVALID_ARGUMENT for a view that names no plan name or has
// an unknown dtype, a negative size or an overflowing extent. A buffer
// written only by empty views has extent 0.
absl::StatusOr<std::map<std::string, int64_t>> ShadowExtents(const v1::Plan& plan, int32_t worker);

// The one predicate deciding whether a worker with these extents stages
// (writes shadows, reports `staged`, takes part in the commit): it writes at
// least one byte. The controller (ShadowBytesByWorker lists exactly these
// workers) and the worker (SyncRunner) both decide with it, so a receiver
// whose views are all empty is a plain participant on both sides.
bool StagesShadow(const std::map<std::string, int64_t>& extents);

// One destination buffer a receiver writes: its shadow's extent and the
// non-empty views written (what a commit copies back, nothing else).
struct BufferWrites {
  int64_t extent = 0;
  std::vector<v1::TensorView> views;
};

// As ShadowExtents, with the written views; buffers of extent 0 left out
// (empty when !StagesShadow).
absl::StatusOr<std::map<std::string, BufferWrites>> ShadowWrites(const v1::Plan& plan,
                                                                 int32_t worker);

// Their sum (0: `worker` writes nothing, it takes no part in a commit).
absl::StatusOr<int64_t> ShadowBytes(const v1::Plan& plan, int32_t worker);

// ShadowBytes of every worker that stages (StagesShadow), in one pass.
absl::StatusOr<std::map<int32_t, int64_t>> ShadowBytesByWorker(const v1::Plan& plan);

}  // namespace wsync

#endif  // WSYNC_COMMON_SHADOW_EXTENTS_H_
