// DataOps on one GPU: every Pack / Unpack / Copy / Reduce call becomes one
// batched kernel launch (worker/backends/cuda/piece_kernels.cu) on the ops' stream,
// however many pieces it holds. Calls are asynchronous; Synchronize() waits
// and reports kernel faults. Tables of calls that repeat (the interpreter
// replays the same items every sync) stay resident on the device, so a
// steady-state sync uploads nothing. Staging comes from a per-device pool:
// a freed buffer is reused by the next allocation it fits, never returned to
// the driver mid-run. Not thread-safe: one instance per executor.
//
// Direct writes are not data ops: CudaPeerWriter (cuda_peer_writer.h) puts
// beside these ops on streams of its own, retiring what it outgrows into
// their RetiredMemory (freed by Synchronize()).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_DATA_OPS_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_DATA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "worker/backends/cuda/batched_kernels.h"
#include "worker/backends/cuda/block_fp8_kernel.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/piece_table.h"
#include "worker/backends/cuda/retired_memory.h"
#include "worker/backends/cuda/wire_hash_kernel.h"
#include "worker/plane/data_ops.h"

namespace wsync::cuda {

class StagingPool;
class CudaPeerWriter;

class CudaDataOps : public exec::DataOps {
 public:
  struct Options {
    int device = 0;
    // Device bytes the resident table cache may hold before it is cleared.
    int64_t table_cache_bytes = int64_t{256} << 20;
    // Grid size of the batched kernels (BatchedKernels::Create), capped at
    // what fits on an SM: 2 blocks for the full kernel (128 registers), 3 for
    // the copy-only one. Blocks claim tasks from a counter, so blocks that
    // wait for SM slots held by another kernel (puts, NCCL) still share the
    // work once they start.
    int blocks_per_sm = 8;
    // The put_* fields configure the CudaPeerWriter of these ops (CudaBackend
    // makes one per channel). Puts of at least this many bytes that convert
    // nothing and have at most 2 dims, each with a contiguous innermost dim,
    // go to the copy engines (one cudaMemcpy2DAsync / cudaMemcpyAsync each);
    // smaller ones stay in one piece-kernel launch. 0 keeps every put on the
    // kernel. docs/direct-writes.md ("How a put is carried out") has the measurements
    // behind the defaults.
    int64_t put_copy_engine_min_bytes = int64_t{4} << 20;
    // Shortest contiguous row (bytes) of a 2-D put sent to a copy engine.
    int64_t put_copy_engine_min_row_bytes = 8192;
    // Grid of the put kernel beside other work: it holds this many SM slots
    // per SM, and the local-copy kernel the rest.
    int put_blocks_per_sm = 1;
    // Streams the copy-engine puts are spread over (balanced by bytes): one
    // stream runs its copies one after another, with a gap between them. One
    // keeps the put phases' order strictly (controller/plan/put_phases.h):
    // against 4 on 4 x H200, Llama colocated4 24.4 -> 22.8 ms, every other
    // 2- and 4-GPU case within -0.3 .. +0.4 % (session 23, runs C and D).
    int put_copy_streams = 1;
    // Blocks of the data ops' kernels that land on SMs [0, n) leave at once,
    // so NCCL's kernel for a round's few token bytes, launched just before the
    // local copies but possibly scheduled after them, never waits for them.
    int reserved_sms = 0;
    // While a peer writer's puts run beside the local copies (ReserveSmsForPuts):
    // SMs [0, n) are left to the put kernel (at most half the device's). 48
    // of an H200's 132 SMs put Qwen3-30B-A3B colocated at 96 % of its HBM
    // floor (92 % without: the put kernel's one block per SM got too little
    // of each SM); the NCCL path, without puts, loses with it
    // (bench/results/gpu-2026-11-27-session17.md, run 7). 0: off.
    int put_reserved_sms = 48;
    // A put call writing to several peers is cut into parts of at most this
    // many MiB (whole rows) and issued interleaved by peer, each peer's share
    // advancing at the same rate, writers on distinct devices starting on
    // distinct peers (worker/plane/put_order.h, cuda/put_list.h): a list grouped by peer would keep
    // every engine on one peer's link at a time. 0: the plan's order, uncut. Off: on 4 x H200
    // parts of 16, 64 and 256 MiB moved no 4-GPU mode beyond its spread
    // (bench/results/gpu-2026-11-28-session19.md, run A).
    int64_t put_interleave_mib = 0;
    // Grid of the checksum kernels (QueueChecksum, QueueWireChecksum): this
    // many blocks of 256 threads per SM, beside the puts and local copies
    // (the wire hash kernel fits 4 per SM; bench/gpu/wire_hash_bench.cc
    // sweeps 1-16). 0: 4.
    int hash_blocks_per_sm = 4;
  };
  static absl::StatusOr<std::unique_ptr<CudaDataOps>> Create(const Options& options);
  ~CudaDataOps() override;

  std::string Name() const override;
  exec::MemorySpace memory_space() const override { return exec::MemorySpace::kCuda; }

  absl::StatusOr<exec::StagingBuffer> AllocateStaging(int64_t bytes) override;
  absl::Status Pack(absl::Span<const exec::PackItem> items, void* staging_base) override;
  absl::Status Unpack(const void* staging_base, absl::Span<const exec::UnpackItem> items) override;
  // A prepared list (handle.id != 0) finds its resident table by the handle
  // after the first call, without reading the items again.
  absl::Status Copy(absl::Span<const exec::CopyItem> items, exec::ItemsHandle handle = {}) override;
  absl::Status Reduce(absl::Span<const exec::ReduceInput> inputs,
                      absl::Span<const exec::ReduceItem> items, const void* staging_base) override;
  // Does not wait for puts (CudaPeerWriter::Fence does); frees what these
  // ops and their writer retired.
  absl::Status Synchronize() override;
  // The GPU twin of chunk_hash::Hash (checksum_kernel.h), after the queued
  // calls; waits for the result (tests/gpu/checksum_kernel_test.cc).
  absl::StatusOr<uint64_t> Checksum(const void* data, int64_t bytes) override;
  absl::Status ResetChecksums(int64_t slots) override;
  absl::Status QueueChecksum(const void* data, int64_t bytes, int64_t slot) override;
  absl::StatusOr<std::vector<uint64_t>> CollectChecksums() override;
  // Direct-write buckets hashed from their views (wire_hash_kernel.h): the
  // table of a prepared list is uploaded on its first call and found by its
  // handle after that (a list without a handle is uploaded every call).
  absl::Status QueueWireChecksum(absl::Span<const exec::WireHashItem> items, int64_t bucket_bytes,
                                 int64_t slot, exec::ItemsHandle handle = {}) override;
  // `mark.handle` is a cudaEvent_t (the NCCL transport's): the stream waits.
  absl::Status WaitForLanding(const transport::LandingMark& mark) override;
  // Mapped, portable pinned host memory (cudaHostAlloc): the kernels reach
  // it through unified addressing (tests/gpu/shadow_set_cuda_test.cc).
  absl::StatusOr<exec::StagingBuffer> AllocateHostShadow(int64_t bytes) override;
  // Block fp8 (worker/backends/cuda/block_fp8_kernel.h): inputs gathered into fp32
  // scratch by one piece-kernel launch, then one quantization launch.
  absl::Status Quantize(absl::Span<const exec::QuantizeInput> inputs,
                        absl::Span<const exec::QuantizeItem> items,
                        const void* staging_base) override;

  int device() const { return device_; }
  const Options& options() const { return options_; }
  // A peer writer prepared puts that run beside this channel's local copies:
  // from now on the copy kernels leave Options::put_reserved_sms SMs to them.
  void ReserveSmsForPuts();
  // Undoes ReserveSmsForPuts: the copy kernels leave Options::reserved_sms
  // SMs again (the writer prepared a plan without puts, or went away).
  void ReleaseSmsForPuts();
  // SMs the copy kernels leave now (tests/gpu/reserved_sms_test.cc).
  int reserved_sms() const;
  cudaStream_t stream() const { return stream_.get(); }
  // Buffers retired since the last Synchronize() (retired_memory.h).
  size_t retired_buffers() const { return retired_.buffers(); }
  // Kernel launches and resident-table hits so far (benchmarks report them;
  // the writer's puts count apart).
  int64_t launches() const { return kernels_->launches(); }
  int64_t table_cache_hits() const { return cache_hits_; }

 private:
  struct CachedTable {
    std::string key;
    DeviceBuffer table;
    TableLayout layout;
  };

  friend class CudaPeerWriter;

  CudaDataOps() = default;
  // Copy under the items' cache key, or replaying `known` (an entry a
  // prepared list resolved to).
  absl::Status CopyKeyed(absl::Span<const exec::CopyItem> items, std::string key,
                         CachedTable* known = nullptr);
  // Launches `table_` (built by the caller) and keeps it resident under
  // `key` (unless empty).
  absl::Status Run(std::string key);
  // A cached call: launches its resident table.
  absl::Status Replay(CachedTable& entry);
  // Adds pack item `it` (no quantization) to `table_`.
  absl::Status AddPackRequest(const exec::PackItem& it, void* staging_base, size_t index);
  // Adds src -> dst to `table_`.
  absl::Status AddCopyItem(const exec::StridedView& src, const exec::StridedView& dst,
                           const char* what, size_t index);
  absl::StatusOr<char*> Scratch(int64_t bytes);
  // Every non-empty item of a copy call: items that `via_scratch`
  // names (ascending; shapes with no common refinement) first go src -> a
  // contiguous copy in the source dtype, carved by `carve`, through
  // `pre_table_`; then `add` takes (that copy or src, dst, item index).
  using ItemAdder =
      std::function<absl::Status(const exec::StridedView&, const exec::StridedView&, size_t)>;
  absl::Status AddItemsViaScratch(absl::Span<const exec::CopyItem> items,
                                  const std::vector<size_t>& via_scratch, const char* what,
                                  const std::function<absl::StatusOr<char*>(int64_t)>& carve,
                                  const ItemAdder& add);
  // Scratch of at least `bytes` (waits for the stream before growing it).
  absl::Status ReserveScratch(int64_t bytes);
  // Pack with block-quantized items (no resident table: two launches).
  absl::Status PackQuantized(absl::Span<const exec::PackItem> items, void* staging_base);
  absl::Status LaunchQuant(const std::vector<QuantRegionDesc>& regions, int64_t blocks);

  Options options_;
  int device_ = 0;
  int64_t table_cache_bytes_ = 0;
  Stream stream_;
  // Memory the calls outgrow, freed by Synchronize() (retired_memory.h):
  // calls issued beside a transfer must not free.
  RetiredMemory retired_;
  std::unique_ptr<BatchedKernels> kernels_;
  std::shared_ptr<StagingPool> pool_;
  PieceTable table_;
  // Second pass of copies that go through scratch (shapes with no common
  // refinement, strided reduce inputs).
  PieceTable pre_table_;
  DeviceBuffer scratch_;
  int64_t scratch_used_ = 0;
  // Keyed by the items; entries never move (named_ points at them). A
  // prepared list (exec::ItemsHandle) resolves to its items' entry once, then
  // by handle: a plan bound again over the same buffers finds its tables by
  // their items.
  // Cleared together.
  absl::node_hash_map<std::string, CachedTable> cache_;
  absl::flat_hash_map<std::string, CachedTable*> named_;
  int64_t cache_device_bytes_ = 0;
  int64_t cache_hits_ = 0;
  DeviceBuffer quant_regions_;
  int MaxHashBlocks();
  DeviceBuffer checksum_sum_;  // one uint64 (Checksum)
  // Queued checksums: one uint64 sum per slot on the device, each slot's
  // byte count on the host (Finish needs it).
  DeviceBuffer checksum_slots_;
  int64_t checksum_slot_capacity_ = 0;
  std::vector<int64_t> checksum_slot_bytes_;
  // Per slot: the terms of a wire checksum's gap words, added at Collect.
  std::vector<uint64_t> checksum_slot_addend_;
  int checksum_max_blocks_ = 0;  // Options::hash_blocks_per_sm per SM: the hash shares the SMs
  // Wire-checksum tables by prepared handle (QueueWireChecksum); retired
  // and rebuilt once they hold more than kMaxWireTableBytes.
  struct WireTable {
    DeviceBuffer buffer;
    WireHashDeviceTable view;
    uint64_t zero_sum = 0;
    int64_t bucket_bytes = 0;
  };
  static constexpr int64_t kMaxWireTableBytes = int64_t{64} << 20;
  absl::StatusOr<WireTable> UploadWireTable(absl::Span<const exec::WireHashItem> items,
                                            int64_t bucket_bytes);
  absl::flat_hash_map<uint64_t, WireTable> wire_tables_;
  int64_t wire_table_bytes_ = 0;
};

// Splits the dims of two views of equal element count (each enumerated
// row-major over its own shape) into one common shape with a stride array for
// each; false when no refinement of at most kMaxRequestDims dims exists.
bool CommonShape(const exec::StridedView& a, const exec::StridedView& b, int64_t* shape,
                 int64_t* a_strides, int64_t* b_strides, int* ndim);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_DATA_OPS_H_
