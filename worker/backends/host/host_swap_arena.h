// The host implementation of plane::SwapArena (docs/commit-swap.md): an
// arena is a memfd (memfd_create, sized with ftruncate) mapped MAP_SHARED at
// an address this process reserved; a swap maps each arena's memfd over the
// other's address with MAP_FIXED (the kernel replaces the pages of the range
// atomically per call), then exchanges the descriptors. Page-rounded.
#ifndef WSYNC_WORKER_BACKENDS_HOST_HOST_SWAP_ARENA_H_
#define WSYNC_WORKER_BACKENDS_HOST_HOST_SWAP_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/plane/swap_arena.h"

namespace wsync::host {

// RESOURCE_EXHAUSTED when the kernel refuses the memory (errno named);
// INVALID_ARGUMENT for a size <= 0 or one that overflows when page-rounded.
absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewHostSwapArena(int64_t bytes,
                                                                   const std::string& name);

}  // namespace wsync::host

#endif  // WSYNC_WORKER_BACKENDS_HOST_HOST_SWAP_ARENA_H_
