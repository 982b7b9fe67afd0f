#include "worker/backends/cuda/batched_kernels.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/piece_kernels.h"

namespace wsync::cuda {
namespace {

size_t RoundUp16(size_t n) { return (n + 15) & ~size_t{15}; }

}  // namespace

TableLayout TableLayout::Of(const PieceTable& table) {
  TableLayout l;
  l.pieces_offset = 0;
  l.tasks_offset = RoundUp16(table.pieces().size() * sizeof(PieceDesc));
  l.inputs_offset = l.tasks_offset + RoundUp16(table.tasks().size() * sizeof(TaskDesc));
  l.counter_offset = l.inputs_offset + RoundUp16(table.inputs().size() * sizeof(uint64_t));
  l.total = l.counter_offset + 16;
  l.num_tasks = static_cast<int64_t>(table.tasks().size());
  l.copy_only = table.copy_only();
  return l;
}

absl::StatusOr<std::unique_ptr<BatchedKernels>> BatchedKernels::Create(int device,
                                                                       int blocks_per_sm) {
  if (blocks_per_sm < 1 || blocks_per_sm > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks per SM must be in [1, 8], got ", blocks_per_sm));
  }
  std::unique_ptr<BatchedKernels> k(new BatchedKernels());
  k->device_ = device;
  int sms = 0;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                             absl::StrCat("multiprocessor count of device ", device));
  int full = 0, copy = 0;
  {
    DeviceGuard guard(device);
    WSYNC_CUDA_RETURN_IF_ERROR(PieceKernelResidentBlocks(false, &full),
                               absl::StrCat("piece kernel occupancy on device ", device));
    WSYNC_CUDA_RETURN_IF_ERROR(PieceKernelResidentBlocks(true, &copy),
                               absl::StrCat("copy kernel occupancy on device ", device));
  }
  k->max_blocks_ = sms * std::max(1, std::min(blocks_per_sm, full));
  k->max_copy_blocks_ = sms * std::max(1, std::min(blocks_per_sm, copy));
  for (Slot& s : k->slots_) {
    auto ev = Event::Create(device);
    if (!ev.ok()) return ev.status();
    s.done = std::move(*ev);
  }
  return k;
}

absl::Status BatchedKernels::Launch(const PieceTable& table, cudaStream_t stream,
                                    DeviceBuffer* resident) {
  if (table.empty()) return absl::OkStatus();
  const TableLayout layout = TableLayout::Of(table);
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  DeviceGuard guard(device_);
  if (slot.pending) {
    // The slot's previous table may still be uploading or read by its kernel.
    if (absl::Status s = slot.done.Synchronize(); !s.ok()) return s;
    slot.pending = false;
  }
  if (slot.host.size() < layout.total) {
    const size_t cap = layout.total + layout.total / 2;
    auto host = PinnedBuffer::Allocate(cap);
    if (!host.ok()) return host.status();
    if (retired_ != nullptr) {
      retired_->Retire(std::move(slot.host));
      retired_->Retire(std::move(slot.dev));
    }
    slot.host = std::move(*host);
    slot.dev.Reset();
  }
  char* h = static_cast<char*>(slot.host.data());
  std::memcpy(h + layout.pieces_offset, table.pieces().data(),
              table.pieces().size() * sizeof(PieceDesc));
  std::memcpy(h + layout.tasks_offset, table.tasks().data(),
              table.tasks().size() * sizeof(TaskDesc));
  if (!table.inputs().empty()) {
    std::memcpy(h + layout.inputs_offset, table.inputs().data(),
                table.inputs().size() * sizeof(uint64_t));
  }
  std::memset(h + layout.counter_offset, 0, layout.total - layout.counter_offset);
  DeviceBuffer* target = resident != nullptr ? resident : &slot.dev;
  if (target->size() < layout.total) {
    const size_t cap = resident != nullptr ? layout.total : slot.host.size();
    auto dev = DeviceBuffer::Allocate(device_, cap);
    if (!dev.ok()) return dev.status();
    if (retired_ != nullptr) retired_->Retire(std::move(*target));
    *target = std::move(*dev);
  }
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(target->data(), h, layout.total, cudaMemcpyHostToDevice, stream),
      absl::StrCat("piece table upload on device ", device_));
  absl::Status s = LaunchUploaded(target->data(), layout, stream);
  if (absl::Status r = slot.done.Record(stream); !r.ok() && s.ok()) s = r;
  slot.pending = true;
  return s;
}

absl::Status BatchedKernels::LaunchResident(const void* device_table, const TableLayout& layout,
                                            cudaStream_t stream) {
  // The last run left the task counter past its last claim.
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(static_cast<char*>(const_cast<void*>(device_table)) + layout.counter_offset,
                      0, sizeof(unsigned long long), stream),
      absl::StrCat("piece table task counter reset on device ", device_));
  return LaunchUploaded(device_table, layout, stream);
}

absl::Status BatchedKernels::LaunchUploaded(const void* device_table, const TableLayout& layout,
                                            cudaStream_t stream) {
  char* d = static_cast<char*>(const_cast<void*>(device_table));
  WSYNC_CUDA_RETURN_IF_ERROR(
      LaunchPieceKernel(
          reinterpret_cast<const PieceDesc*>(d + layout.pieces_offset),
          reinterpret_cast<const TaskDesc*>(d + layout.tasks_offset), layout.num_tasks,
          reinterpret_cast<const uint64_t*>(d + layout.inputs_offset),
          reinterpret_cast<unsigned long long*>(d + layout.counter_offset), layout.copy_only,
          layout.copy_only ? max_copy_blocks_ : max_blocks_, reserved_sms_, stream),
      absl::StrCat("piece kernel launch (", layout.num_tasks, " tasks) on device ", device_));
  ++launches_;
  return absl::OkStatus();
}

}  // namespace wsync::cuda
