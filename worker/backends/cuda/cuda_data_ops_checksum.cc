// CudaDataOps' staged-sync helpers (docs/staging.md): the bucket checksum on
// the GPU (one call, or queued per slot and collected at the end of a sync)
// and host shadow memory. tests/gpu/checksum_kernel_test.cc checks both
// against the host's hash (scripts/gpu_run.sh; run on H200, session 15).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/chunk_hash.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/checksum_kernel.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_status.h"

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
    checksum_max_blocks_ = 4 * sms;
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
    out[i] = chunk_hash::Finish(static_cast<uint64_t>(sums[i]), checksum_slot_bytes_[i]);
  }
  return out;
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
