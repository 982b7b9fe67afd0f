// sync_bench --diagnose-ce-probes: the two-process replica's copy-engine
// writes (ipc_put_bench push_ce) timed inside a sync worker at several points
// of its set-up, to find which step slows the copy engines' peer writes
// (bench/results/gpu-2026-11-26-session8.md). Each probe uses its own fresh
// memory and lines the two processes up with a spin barrier in shared memory,
// so that it adds no CUDA or NCCL state of its own beyond that memory.
#ifndef WSYNC_BENCH_GPU_CE_PROBE_H_
#define WSYNC_BENCH_GPU_CE_PROBE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {

// Two processes meet here; precise to microseconds (no sleeps).
class SpinBarrier {
 public:
  static absl::StatusOr<SpinBarrier> Open(const std::string& path, int parties);
  SpinBarrier(SpinBarrier&& o) noexcept;
  SpinBarrier& operator=(SpinBarrier&&) = delete;
  ~SpinBarrier();
  absl::Status Wait();

 private:
  SpinBarrier() = default;
  std::atomic<uint64_t>* counter_ = nullptr;
  int parties_ = 0;
  uint64_t rounds_ = 0;
};

// How a probe's memory differs from the replica's (all off: as ipc_put_bench).
struct ProbeMemory {
  bool source_unwritten = false;        // no memset: as cudaMalloc left it
  bool source_random = false;           // random 16-bit values instead of a constant byte
  bool destination_doubled = false;     // twice the size; worker w writes the w-th half
  bool registry_open = false;           // exported and opened through cuda::IpcRegistry
  int64_t destination_extra_bytes = 0;  // allocated past the 2 MiB multiple it would be
  bool wsync_stream = false;            // the stream from cuda::Stream::Create (with a priority)
};

// Both workers call this with the same `label`, in the same order.
absl::Status RunCeProbe(const std::string& label, int worker, int iters, transport::KvStore& store,
                        const std::function<absl::Status()>& barrier,
                        const ProbeMemory& memory = {});

// RunCeProbe once per ProbeMemory difference, one at a time (labels
// "<prefix>/memory<k>"), including destination sizes 256 B to 1 MiB past a
// multiple of 2 MiB.
absl::Status RunCeProbeMemorySweep(const std::string& prefix, int worker, int iters,
                                   transport::KvStore& store,
                                   const std::function<absl::Status()>& barrier);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_CE_PROBE_H_
