// CudaDataOps' staged-sync helpers (docs/staging.md): the bucket checksum on
// the GPU (one call, or queued per slot and collected at the end of a sync)
// from the views of a direct-write bucket (wire_hash_kernel.h) and host
// shadow memory. tests/gpu/checksum_kernel_test.cc checks both
// against the host's hash (scripts/gpu_run.sh; run on H200, session 15).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chunk_hash.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/checksum_kernel.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/plane/wire_hash.h"

namespace wsync::cuda {

absl::StatusOr<uint64_t> CudaDataOps::Checksum(const void* data, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum of ", bytes, " bytes at ", data == nullptr ? "null" : "an address"));
  }
  if (checksum_sum_.data() == nullptr) {
    ASSIGN_OR_RETURN(checksum_sum_, DeviceBuffer::Allocate(device_, sizeof(uint64_t)));
  }
  auto* sum = static_cast<unsigned long long*>(checksum_sum_.data());
  RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(sum, 0, sizeof(*sum), stream_.get()),
                             absl::StrCat("checksum on device ", device_, ": clearing the sum")));
  RETURN_IF_ERROR(CudaStatus(LaunchChunkHashSum(data, bytes, sum, stream_.get(), MaxHashBlocks()),
                             absl::StrCat("checksum of ", bytes, " bytes on device ", device_)));
  unsigned long long host = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(&host, sum, sizeof(host), cudaMemcpyDeviceToHost, stream_.get()),
                 absl::StrCat("checksum on device ", device_, ": reading the sum")));
  RETURN_IF_ERROR(Synchronize());
  return chunk_hash::Finish(static_cast<uint64_t>(host), bytes);
}

absl::Status CudaDataOps::WaitForLanding(const transport::LandingMark& mark) {
  if (mark.handle == nullptr) return absl::OkStatus();
  auto* event = static_cast<cudaEvent_t>(const_cast<void*>(mark.handle));
  return CudaStatus(cudaStreamWaitEvent(stream_.get(), event, 0),
                    absl::StrCat("device ", device_, ": waiting for a transfer's landing mark"));
}

int CudaDataOps::MaxHashBlocks() {
  if (checksum_max_blocks_ == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_) != cudaSuccess ||
        sms <= 0) {
      sms = 32;
    }
    checksum_max_blocks_ =
        (options_.hash_blocks_per_sm > 0 ? options_.hash_blocks_per_sm : 4) * sms;
  }
  return checksum_max_blocks_;
}

absl::Status CudaDataOps::ResetChecksums(int64_t slots) {
  if (slots < 0) return absl::InvalidArgumentError(absl::StrCat("negative checksum slots ", slots));
  if (slots > checksum_slot_capacity_) {
    ASSIGN_OR_RETURN(checksum_slots_, DeviceBuffer::Allocate(
                                          device_, static_cast<size_t>(slots) * sizeof(uint64_t)));
    checksum_slot_capacity_ = slots;
  }
  checksum_slot_bytes_.assign(static_cast<size_t>(slots), 0);
  checksum_slot_addend_.assign(static_cast<size_t>(slots), 0);
  if (slots == 0) return absl::OkStatus();
  return CudaStatus(cudaMemsetAsync(checksum_slots_.data(), 0,
                                    static_cast<size_t>(slots) * sizeof(uint64_t), stream_.get()),
                    absl::StrCat("checksums on device ", device_, ": clearing ", slots, " slots"));
}

absl::Status CudaDataOps::QueueChecksum(const void* data, int64_t bytes, int64_t slot) {
  if (slot < 0 || slot >= static_cast<int64_t>(checksum_slot_bytes_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checksum slot ", slot, " of ", checksum_slot_bytes_.size(), " (ResetChecksums)"));
  }
  if (bytes < 0 || (bytes > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum of ", bytes, " bytes at ", data == nullptr ? "null" : "an address"));
  }
  checksum_slot_bytes_[static_cast<size_t>(slot)] = bytes;
  auto* sums = static_cast<unsigned long long*>(checksum_slots_.data());
  return CudaStatus(
      LaunchChunkHashSum(data, bytes, sums + slot, stream_.get(), MaxHashBlocks()),
      absl::StrCat("checksum of ", bytes, " bytes on device ", device_, " (slot ", slot, ")"));
}

absl::StatusOr<std::vector<uint64_t>> CudaDataOps::CollectChecksums() {
  const size_t n = checksum_slot_bytes_.size();
  std::vector<unsigned long long> sums(n, 0);
  if (n > 0) {
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(sums.data(), checksum_slots_.data(), n * sizeof(uint64_t),
                                   cudaMemcpyDeviceToHost, stream_.get()),
                   absl::StrCat("checksums on device ", device_, ": reading ", n)));
  }
  RETURN_IF_ERROR(Synchronize());
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = chunk_hash::Finish(static_cast<uint64_t>(sums[i]) + checksum_slot_addend_[i],
                                checksum_slot_bytes_[i]);
  }
  return out;
}

absl::StatusOr<CudaDataOps::WireTable> CudaDataOps::UploadWireTable(
    absl::Span<const exec::WireHashItem> items, int64_t bucket_bytes) {
  RETURN_IF_ERROR(exec::CheckWireHashItems(items, bucket_bytes));
  std::vector<WireHashDesc> descs;
  descs.reserve(items.size());
  for (const exec::WireHashItem& it : items) {
    WireHashDesc d;
    d.data = static_cast<const unsigned char*>(it.view.data);
    d.offset = it.bucket_offset;
    d.src_dtype = it.view.dtype;
    d.via_dtype = it.via != v1::DTYPE_UNSPECIFIED ? it.via : it.view.dtype;
    d.wire_dtype = it.wire_dtype;
    d.src_size = static_cast<int32_t>(DTypeSize(it.view.dtype));
    d.wire_size = static_cast<int32_t>(DTypeSize(it.wire_dtype));
    d.bytes = it.view.num_elements() * d.wire_size;
    d.ndim = std::max(it.view.ndim, 1);
    for (int k = 0; k < d.ndim; ++k) {
      d.shape[k] = it.view.ndim == 0 ? 1 : it.view.shape[k];
      d.strides[k] = it.view.ndim == 0 ? 1 : it.view.strides[k];
    }
    d.raw = it.view.contiguous() && d.src_dtype == d.via_dtype && d.via_dtype == d.wire_dtype;
    descs.push_back(d);
  }
  const WireHashTable t = BuildWireHashTable(std::move(descs), bucket_bytes);
  const size_t n = t.items.size();
  const size_t item_bytes = n * sizeof(WireHashDesc);
  const size_t words = t.first_word.size() + t.interior_before.size() + t.boundary_words.size();
  std::vector<unsigned char> host(item_bytes + words * sizeof(int64_t));
  std::memcpy(host.data(), t.items.data(), item_bytes);
  size_t at = item_bytes;
  for (const std::vector<int64_t>* v : {&t.first_word, &t.interior_before, &t.boundary_words}) {
    std::memcpy(host.data() + at, v->data(), v->size() * sizeof(int64_t));
    at += v->size() * sizeof(int64_t);
  }
  WireTable out;
  out.zero_sum = t.zero_sum;
  out.bucket_bytes = bucket_bytes;
  if (host.empty()) return out;
  ASSIGN_OR_RETURN(out.buffer, DeviceBuffer::Allocate(device_, host.size()));
  // Pageable: returns once staged, so `host` may go.
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(out.buffer.data(), host.data(), host.size(),
                                 cudaMemcpyHostToDevice, stream_.get()),
                 absl::StrCat("device ", device_, ": uploading a wire-checksum table")));
  auto* base = static_cast<unsigned char*>(out.buffer.data());
  out.view.items = reinterpret_cast<const WireHashDesc*>(base);
  out.view.first_word = reinterpret_cast<const int64_t*>(base + item_bytes);
  out.view.interior_before = out.view.first_word + t.first_word.size();
  out.view.boundary_words = out.view.interior_before + t.interior_before.size();
  out.view.num_items = static_cast<int64_t>(n);
  out.view.num_boundary = static_cast<int64_t>(t.boundary_words.size());
  out.view.interior_words = t.interior_before.back();
  return out;
}

absl::Status CudaDataOps::QueueWireChecksum(absl::Span<const exec::WireHashItem> items,
                                            int64_t bucket_bytes, int64_t slot,
                                            exec::ItemsHandle handle) {
  if (slot < 0 || slot >= static_cast<int64_t>(checksum_slot_bytes_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checksum slot ", slot, " of ", checksum_slot_bytes_.size(), " (ResetChecksums)"));
  }
  WireTable unprepared;
  const WireTable* table = nullptr;
  if (handle.id != 0) {
    auto it = wire_tables_.find(handle.id);
    if (it != wire_tables_.end() && it->second.bucket_bytes == bucket_bytes) table = &it->second;
  }
  if (table == nullptr) {
    ASSIGN_OR_RETURN(unprepared, UploadWireTable(items, bucket_bytes));
    if (handle.id != 0) {
      if (wire_table_bytes_ > kMaxWireTableBytes) {
        // Plans bound long ago: their tables go once the stream passed them.
        for (auto& [id, old] : wire_tables_) retired_.Retire(std::move(old.buffer));
        wire_tables_.clear();
        wire_table_bytes_ = 0;
      }
      wire_table_bytes_ += static_cast<int64_t>(unprepared.buffer.size());
      table = &(wire_tables_[handle.id] = std::move(unprepared));
    } else {
      table = &unprepared;
    }
  }
  checksum_slot_bytes_[static_cast<size_t>(slot)] = bucket_bytes;
  checksum_slot_addend_[static_cast<size_t>(slot)] += table->zero_sum;
  auto* sums = static_cast<unsigned long long*>(checksum_slots_.data());
  absl::Status s = CudaStatus(
      LaunchWireHashSum(table->view, bucket_bytes, sums + slot, stream_.get(), MaxHashBlocks()),
      absl::StrCat("wire checksum of a ", bucket_bytes, "-byte bucket on device ", device_,
                   " (slot ", slot, ")"));
  // A table of no prepared list is freed once the stream passed it.
  if (table == &unprepared && unprepared.buffer.data() != nullptr) {
    retired_.Retire(std::move(unprepared.buffer));
  }
  return s;
}

absl::StatusOr<exec::StagingBuffer> CudaDataOps::AllocateHostShadow(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative shadow size ", bytes));
  if (bytes == 0) return exec::StagingBuffer();
  void* p = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocMapped | cudaHostAllocPortable),
      absl::StrCat("host shadow of ", bytes, " bytes (cudaHostAlloc)")));
  return exec::StagingBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
}

}  // namespace wsync::cuda
