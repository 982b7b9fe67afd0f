// Copies handed to the GPU's copy engines instead of the batched kernel
// (CudaDataOps::Options::copy_engine; off by default).
//
// The idea: in a colocated sync the local copies run while NCCL moves bytes
// over NVLink, NCCL's transfer is SM-driven, and wsync's kernel takes every
// SM. One 6.8 GB cudaMemcpyAsync beside the Llama-3-8B colocated transfer
// does end sooner than the kernel (4.56 vs 5.09 ms on H200), but real plans
// got slower with their copies batched onto the engines (Llama colocated
// 6.3 -> 7.1-9.6 ms, Qwen3-30B-A3B TP=1 172 -> 239 ms;
// bench/results/gpu-2026-11-26-session4.md). Kept, tested, for GPUs where
// that balance differs.
//
// A request qualifies when it converts nothing, its innermost dim is
// contiguous on both sides, it has at most max_dims (<= 3) dims once
// contiguous dims are merged, and it is big enough. All of one call's
// qualifying copies go out as one cudaMemcpy3DBatchAsync.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_COPY_ENGINE_BATCH_H_
#define WSYNC_WORKER_BACKENDS_CUDA_COPY_ENGINE_BATCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/backends/cuda/piece_table.h"

namespace wsync::cuda {

struct CopyEngineOptions {
  // Requests of at least this many bytes may go to the copy engines; 0 keeps
  // every request on the kernel.
  int64_t min_bytes = 0;
  // Shortest contiguous row (bytes) worth a copy engine, for 2-D and 3-D
  // requests.
  int64_t min_row_bytes = 1024;
  // Most dims (1-3) a request may have once contiguous dims are merged.
  int max_dims = 3;
};

class CopyEngineBatch {
 public:
  explicit CopyEngineBatch(CopyEngineOptions options = {}) : options_(options) {}

  // Takes the request (true) when it qualifies; otherwise leaves it to the
  // caller's kernel table (false). Same arguments as PieceTable::AddCopy.
  bool TryAdd(const ViewRef& src, const ViewRef& dst, const int64_t* shape, int ndim);

  // Enqueues every taken copy on `stream`, in one call; a no-op when empty.
  absl::Status Issue(cudaStream_t stream);

  void Clear();
  bool empty() const { return ops_.empty(); }
  int64_t copies() const { return static_cast<int64_t>(ops_.size()); }
  int64_t bytes() const { return bytes_; }

 private:
  CopyEngineOptions options_;
  std::vector<cudaMemcpy3DBatchOp> ops_;
  int64_t bytes_ = 0;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_COPY_ENGINE_BATCH_H_
