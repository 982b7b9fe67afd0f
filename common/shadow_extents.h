// Staged syncs (docs/staging.md): which destination buffers a worker's part
// writes as a receiver, and how much of each. A receiver's shadow copy of a
// buffer covers bytes [0, extent) (the highest byte any write reaches), so
// the controller (Plan, the budget check) and the worker (allocation, the
// commit copy) compute the same sizes from the same plan.
#ifndef WSYNC_COMMON_SHADOW_EXTENTS_H_
#define WSYNC_COMMON_SHADOW_EXTENTS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "wsync/v1/plan.pb.h"

namespace wsync {

// Plan buffer name ("<group>/<name>") -> extent in bytes, for every
// DESTINATION_BUFFER view `worker` writes in `plan` (a whole plan or the
// worker's part): pieces of the buckets it receives (network and local, not
// the inputs of a reduce or quantize), its reduces' and quantizes'
// destinations. INVALID_ARGUMENT for a view that names no plan name or has
// an unknown dtype, a negative size or an overflowing extent.
absl::StatusOr<std::map<std::string, int64_t>> ShadowExtents(const v1::Plan& plan, int32_t worker);

// Their sum (0: `worker` writes nothing, it takes no part in a commit).
absl::StatusOr<int64_t> ShadowBytes(const v1::Plan& plan, int32_t worker);

// ShadowBytes of every worker that writes something, in one pass.
absl::StatusOr<std::map<int32_t, int64_t>> ShadowBytesByWorker(const v1::Plan& plan);

}  // namespace wsync

#endif  // WSYNC_COMMON_SHADOW_EXTENTS_H_
