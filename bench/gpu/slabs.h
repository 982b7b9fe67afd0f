// The benchmarks' stand-ins for a trainer's parameters and vLLM's weights:
// one cudaMalloc "slab" per side and worker, carved into the buffers the
// plan's layouts name.
#ifndef WSYNC_BENCH_GPU_SLABS_H_
#define WSYNC_BENCH_GPU_SLABS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "controller/plan/compiled_layout.h"
#include "worker/exec/buffer_registry.h"
#include "worker/plane/swap_arena.h"

namespace wsync::bench {

// Bytes each (rank, buffer) of a side needs, from its compiled fragments.
struct BufferNeed {
  int64_t bytes = 0;
  DType dtype = v1::DTYPE_UNSPECIFIED;
};
absl::StatusOr<std::map<std::string, BufferNeed>> BuffersOf(const v1::Side& side,
                                                            plan::SideRole role, int32_t worker);

// One slab per side, carved into 256-byte aligned buffers (as a caching
// allocator would hand them out).
struct Slab {
  void* base = nullptr;
  std::vector<std::pair<std::string, exec::RegisteredBuffer>> buffers;
  int64_t bytes = 0;
  // Set: the slab is this arena's memory (--commit swap), freed with it.
  std::shared_ptr<plane::SwapArena> arena;
  Slab() = default;
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
  ~Slab();
};

// The buffers of `need` carved from `base` (deterministic: a peer computes
// another worker's layout from its own copy of the plan).
std::vector<std::pair<std::string, exec::RegisteredBuffer>> CarveSlab(
    const std::map<std::string, BufferNeed>& need, void* base);

// Allocates `slab` for `need`, its size rounded up to a multiple of
// `round_bytes` (0: none). PyTorch's caching allocator makes every segment
// that holds a large tensor a multiple of 2 MiB; CUDA IPC peers write an
// allocation that is not a multiple of 64 KiB about 25 % slower with the copy
// engines (bench/results/gpu-2026-11-26-session8.md), so the benchmarks round
// as PyTorch does unless told otherwise.
absl::Status MakeSlab(const std::map<std::string, BufferNeed>& need, int64_t round_bytes,
                      Slab& slab);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_SLABS_H_
