// The CUDA implementation of plane::SwapArena (docs/commit-swap.md): an
// arena is one physical allocation (cuMemCreate, pinned device memory,
// granularity-rounded) mapped read-write for its device at an address range
// reserved for it (cuMemAddressReserve, cuMemMap, cuMemSetAccess). A swap
// unmaps both ranges and maps each allocation at the other's address, then
// grants access again: about 100-160 us per mapping measured on H100
// (bench/gpu/vmm_swap_bench.cc), whatever the size. Driver entry points come
// through driver_api.h (no libcuda link).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_SWAP_ARENA_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_SWAP_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/plane/swap_arena.h"

namespace wsync::cuda {

// An arena of at least `bytes` on `device`. RESOURCE_EXHAUSTED when the
// device lacks the memory; INVALID_ARGUMENT for a bad size; the driver's
// error (naming the call, arena and device) otherwise.
absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewCudaSwapArena(int device, int64_t bytes,
                                                                   const std::string& name);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_SWAP_ARENA_H_
