// DataOps on one GPU: every Pack / Unpack / Copy / Reduce call becomes one
// batched kernel launch (worker/cuda/piece_kernels.cu) on the ops' stream,
// however many pieces it holds. Calls are asynchronous; Synchronize() waits
// and reports kernel faults. Tables of calls that repeat (the interpreter
// replays the same items every sync) stay resident on the device, so a
// steady-state sync uploads nothing. Staging comes from a per-device pool:
// a freed buffer is reused by the next allocation it fits, never returned to
// the driver mid-run. Not thread-safe: one instance per executor.
#ifndef WSYNC_WORKER_CUDA_CUDA_DATA_OPS_H_
#define WSYNC_WORKER_CUDA_CUDA_DATA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/cuda/batched_kernels.h"
#include "worker/cuda/block_fp8_kernel.h"
#include "worker/cuda/copy_engine_batch.h"
#include "worker/cuda/cuda_handles.h"
#include "worker/cuda/piece_table.h"
#include "worker/exec/data_ops.h"

namespace wsync::cuda {

class StagingPool;

class CudaDataOps : public exec::DataOps {
 public:
  struct Options {
    int device = 0;
    // Device bytes the resident table cache may hold before it is cleared.
    int64_t table_cache_bytes = int64_t{256} << 20;
    // Grid size of the batched kernels (BatchedKernels::Create).
    int blocks_per_sm = 8;
    // Which pack / unpack / copy requests go to the copy engines
    // (copy_engine_batch.h); the default min_bytes 0 keeps all on the kernel.
    CopyEngineOptions copy_engine;
  };
  static absl::StatusOr<std::unique_ptr<CudaDataOps>> Create(const Options& options);
  ~CudaDataOps() override;

  std::string Name() const override;
  exec::MemorySpace memory_space() const override { return exec::MemorySpace::kCuda; }

  absl::StatusOr<exec::StagingBuffer> AllocateStaging(int64_t bytes) override;
  absl::Status Pack(absl::Span<const exec::PackItem> items, void* staging_base) override;
  absl::Status Unpack(const void* staging_base, absl::Span<const exec::UnpackItem> items) override;
  absl::Status Copy(absl::Span<const exec::CopyItem> items) override;
  absl::Status Reduce(absl::Span<const exec::ReduceInput> inputs,
                      absl::Span<const exec::ReduceItem> items, const void* staging_base) override;
  absl::Status Synchronize() override;
  // Block fp8 (worker/cuda/block_fp8_kernel.h): inputs gathered into fp32
  // scratch by one piece-kernel launch, then one quantization launch.
  absl::Status Quantize(absl::Span<const exec::QuantizeInput> inputs,
                        absl::Span<const exec::QuantizeItem> items,
                        const void* staging_base) override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  // Kernel launches and resident-table hits so far (benchmarks report them).
  int64_t launches() const { return kernels_->launches(); }
  int64_t table_cache_hits() const { return cache_hits_; }
  // Copies and bytes sent to the copy engines so far.
  int64_t copy_engine_copies() const { return copy_engine_copies_; }
  int64_t copy_engine_bytes() const { return copy_engine_bytes_; }

 private:
  struct CachedTable {
    std::string key;
    DeviceBuffer table;  // empty when every request went to the copy engines
    TableLayout layout;
    CopyEngineBatch copy_engine;
  };

  CudaDataOps() = default;
  // Runs `copy_engine_` and `table_` (built by the caller) and keeps them
  // resident under `key` (unless empty).
  absl::Status Run(std::string key);
  // A cached call: its copy-engine batch, then its resident table.
  absl::Status Replay(CachedTable& entry);
  // Adds one pack / unpack / copy request to the copy-engine batch if it
  // qualifies, else to `table_`.
  absl::Status AddRequest(const ViewRef& src, const ViewRef& dst, const int64_t* shape, int ndim,
                          const char* label);
  // Adds pack item `it` (no quantization) to `table_`, or, where
  // copy_engine_ok and it qualifies, to the copy-engine batch.
  absl::Status AddPackRequest(const exec::PackItem& it, void* staging_base, size_t index,
                              bool copy_engine_ok);
  // Adds src -> dst to `table_`, or, where copy_engine_ok and it qualifies,
  // to the copy-engine batch.
  absl::Status AddCopyItem(const exec::StridedView& src, const exec::StridedView& dst,
                           const char* what, size_t index, bool copy_engine_ok = false);
  absl::StatusOr<char*> Scratch(int64_t bytes);
  // Scratch of at least `bytes` (waits for the stream before growing it).
  absl::Status ReserveScratch(int64_t bytes);
  // Pack with block-quantized items (no resident table: two launches).
  absl::Status PackQuantized(absl::Span<const exec::PackItem> items, void* staging_base);
  absl::Status LaunchQuant(const std::vector<QuantRegionDesc>& regions, int64_t blocks);

  int device_ = 0;
  int64_t table_cache_bytes_ = 0;
  Stream stream_;
  std::unique_ptr<BatchedKernels> kernels_;
  std::shared_ptr<StagingPool> pool_;
  PieceTable table_;
  CopyEngineBatch copy_engine_;
  int64_t copy_engine_copies_ = 0;
  int64_t copy_engine_bytes_ = 0;
  // Second pass of copies that go through scratch (shapes with no common
  // refinement, strided reduce inputs).
  PieceTable pre_table_;
  DeviceBuffer scratch_;
  int64_t scratch_used_ = 0;
  absl::flat_hash_map<std::string, CachedTable> cache_;
  int64_t cache_device_bytes_ = 0;
  int64_t cache_hits_ = 0;
  DeviceBuffer quant_regions_;
};

// Splits the dims of two views of equal element count (each enumerated
// row-major over its own shape) into one common shape with a stride array for
// each; false when no refinement of at most kMaxRequestDims dims exists.
bool CommonShape(const exec::StridedView& a, const exec::StridedView& b, int64_t* shape,
                 int64_t* a_strides, int64_t* b_strides, int* ndim);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_CUDA_CUDA_DATA_OPS_H_
