// Uploads a PieceTable to the device and runs it with one kernel launch.
// Table uploads go through a small ring of pinned/device slots, each guarded by
// an event, so consecutive launches never overwrite a table still in use.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_BATCHED_KERNELS_H_
#define WSYNC_WORKER_BACKENDS_CUDA_BATCHED_KERNELS_H_

#include <cuda_runtime_api.h>

#include <array>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/piece_table.h"
#include "worker/backends/cuda/retired_memory.h"

namespace wsync::cuda {

// Where each part of a serialized table lies (16-byte aligned parts).
struct TableLayout {
  size_t pieces_offset = 0;
  size_t tasks_offset = 0;
  size_t inputs_offset = 0;
  size_t counter_offset = 0;  // the launch's next-task counter (zeroed per launch)
  size_t total = 0;
  int64_t num_tasks = 0;
  bool copy_only = false;  // every piece a plain copy: the lean kernel
  static TableLayout Of(const PieceTable& table);
};

class BatchedKernels {
 public:
  // Kernels use at most blocks_per_sm blocks of 256 threads per SM, and
  // never more than fit on an SM at once (the kernel's register use decides;
  // more blocks would only wait for a free slot). Fewer leave SM slots and
  // HBM bandwidth to kernels beside them.
  static absl::StatusOr<std::unique_ptr<BatchedKernels>> Create(int device, int blocks_per_sm = 8);

  // Enqueues the whole table on `stream` (one H2D upload, one launch) and
  // returns without waiting for it. With `resident`, the table is uploaded
  // into *resident (reallocated to fit) and stays there for LaunchResident.
  absl::Status Launch(const PieceTable& table, cudaStream_t stream,
                      DeviceBuffer* resident = nullptr);

  // Launches a table kept on the device by an earlier Launch: no upload (a
  // 8-byte memset resets its task counter). One table must not run twice at
  // once.
  absl::Status LaunchResident(const void* device_table, const TableLayout& layout,
                              cudaStream_t stream);

  int device() const { return device_; }
  int64_t launches() const { return launches_; }
  // Blocks that land on SMs [0, n) of later launches leave at once (see
  // LaunchPieceKernel); 0 (the default) uses every SM.
  void set_reserved_sms(int n) { reserved_sms_ = n; }
  int reserved_sms() const { return reserved_sms_; }
  // Buffers Launch outgrows go here instead of being freed (not owned; may
  // be null: freed at once). See retired_memory.h.
  void set_retired(RetiredMemory* retired) { retired_ = retired; }

 private:
  struct Slot {
    PinnedBuffer host;
    DeviceBuffer dev;
    Event done;
    bool pending = false;
  };
  static constexpr int kSlots = 4;

  BatchedKernels() = default;
  absl::Status LaunchUploaded(const void* device_table, const TableLayout& layout,
                              cudaStream_t stream);

  int device_ = 0;
  // Grid caps for the full and the copy-only kernel: blocks_per_sm, or
  // fewer when fewer fit on an SM.
  int max_blocks_ = 0;
  int max_copy_blocks_ = 0;
  int reserved_sms_ = 0;
  RetiredMemory* retired_ = nullptr;
  int next_ = 0;
  int64_t launches_ = 0;
  std::array<Slot, kSlots> slots_;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_BATCHED_KERNELS_H_
