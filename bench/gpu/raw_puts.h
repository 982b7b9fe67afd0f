// sync_bench --diagnose-raw-puts: a colocated plan's direct writes timed
// alone, straight through CudaPeerWriter::Put, from and into several kinds of
// memory (bench/results/gpu-2026-11-26-session7.md, section 3).
#ifndef WSYNC_BENCH_GPU_RAW_PUTS_H_
#define WSYNC_BENCH_GPU_RAW_PUTS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/backends/cuda/cuda_peer_writer.h"
#include "worker/plane/data_ops.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {

// Two workers (each the other's only peer), both calling this at once;
// `barrier` lines them up before every timed run. Prints one RESULT line per
// variant. `source_slab`: the base of the plan's source allocation. `probe`
// (ce_probe.h) runs at the start, once the fresh memory is mapped, and last.
absl::Status DiagnoseRawPuts(int iters, int worker, const std::vector<exec::CopyItem>& puts,
                             void* source_slab, cuda::CudaPeerWriter& writer,
                             transport::KvStore& store, const std::string& tag,
                             const std::function<absl::Status()>& barrier,
                             const std::function<absl::Status(const std::string&)>& probe);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_RAW_PUTS_H_
