// End-to-end check of a benchmark sync on one worker: sources are filled per
// (tensor, box) fragment, so every copy of one box (TP-replicated norms, DP
// trainer replicas, replicated GQA k/v heads) holds the same values, and each
// side is summed counting every distinct (tensor, box) once — on the rank
// that holds it lowest. The destination's sum over all workers then equals the
// source's exactly when every destination element got its source value
// (order-independent: resharding and fusion move elements, never change them).
#ifndef WSYNC_BENCH_GPU_FRAGMENT_CHECK_H_
#define WSYNC_BENCH_GPU_FRAGMENT_CHECK_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "controller/plan/compiled_layout.h"
#include "worker/exec/buffer_registry.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::bench {

// Fills this worker's fragments of the source side (16- and 32-bit dtypes;
// 32-bit elements get values a bf16 cast keeps exactly, see bench_kernels.h).
absl::Status FillSourceFragments(const v1::Side& side, int32_t worker,
                                 const exec::BufferRegistry& registry, cudaStream_t stream);

// Sum over this worker's fragments of `side` that no lower rank holds with
// the same box.
absl::StatusOr<unsigned long long> SideChecksum(const v1::Side& side, plan::SideRole role,
                                                int32_t worker,
                                                const exec::BufferRegistry& registry,
                                                cudaStream_t stream);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_FRAGMENT_CHECK_H_
