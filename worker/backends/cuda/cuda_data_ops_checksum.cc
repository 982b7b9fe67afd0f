// CudaDataOps' staged-sync helpers (docs/staging.md): the bucket checksum on
// the GPU and host shadow memory. Both UNTESTED ON A GPU: written and
// compiled (nvcc) without one; tests/gpu/checksum_kernel_test.cc checks the
// checksum against the host's (scripts/gpu_run.sh).
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
  RETURN_IF_ERROR(CudaStatus(LaunchChunkHashSum(data, bytes, sum, stream_.get()),
                             absl::StrCat("checksum of ", bytes, " bytes on device ", device_)));
  unsigned long long host = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(&host, sum, sizeof(host), cudaMemcpyDeviceToHost, stream_.get()),
                 absl::StrCat("checksum on device ", device_, ": reading the sum")));
  RETURN_IF_ERROR(Synchronize());
  return chunk_hash::Finish(static_cast<uint64_t>(host), bytes);
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
