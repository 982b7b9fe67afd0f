#include "worker/cuda/batched_kernels.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/piece_kernels.h"

namespace wsync::cuda {
namespace {

size_t RoundUp16(size_t n) { return (n + 15) & ~size_t{15}; }

}  // namespace

TableLayout TableLayout::Of(const PieceTable& table) {
  TableLayout l;
  l.pieces_offset = 0;
  l.tasks_offset = RoundUp16(table.pieces().size() * sizeof(PieceDesc));
  l.inputs_offset = l.tasks_offset + RoundUp16(table.tasks().size() * sizeof(TaskDesc));
  l.total = l.inputs_offset + RoundUp16(table.inputs().size() * sizeof(uint64_t));
  l.num_tasks = static_cast<int64_t>(table.tasks().size());
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
  // 8 blocks of 256 threads per SM keep enough loads in flight to reach HBM
  // bandwidth; more only adds scheduling overhead.
  k->max_blocks_ = sms * blocks_per_sm;
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
  DeviceBuffer* target = resident != nullptr ? resident : &slot.dev;
  if (target->size() < layout.total) {
    const size_t cap = resident != nullptr ? layout.total : slot.host.size();
    auto dev = DeviceBuffer::Allocate(device_, cap);
    if (!dev.ok()) return dev.status();
    *target = std::move(*dev);
  }
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(target->data(), h, layout.total, cudaMemcpyHostToDevice, stream),
      absl::StrCat("piece table upload on device ", device_));
  absl::Status s = LaunchResident(target->data(), layout, stream);
  if (absl::Status r = slot.done.Record(stream); !r.ok() && s.ok()) s = r;
  slot.pending = true;
  return s;
}

absl::Status BatchedKernels::LaunchResident(const void* device_table, const TableLayout& layout,
                                            cudaStream_t stream) {
  const char* d = static_cast<const char*>(device_table);
  WSYNC_CUDA_RETURN_IF_ERROR(
      LaunchPieceKernel(
          reinterpret_cast<const PieceDesc*>(d + layout.pieces_offset),
          reinterpret_cast<const TaskDesc*>(d + layout.tasks_offset), layout.num_tasks,
          reinterpret_cast<const uint64_t*>(d + layout.inputs_offset), max_blocks_, stream),
      absl::StrCat("piece kernel launch (", layout.num_tasks, " tasks) on device ", device_));
  ++launches_;
  return absl::OkStatus();
}

}  // namespace wsync::cuda
