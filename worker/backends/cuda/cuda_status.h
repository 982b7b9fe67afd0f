// CUDA runtime / driver errors as absl::Status. Every message names the call
// that failed and the caller's context (device, tensor, peer).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_STATUS_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_STATUS_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wsync::cuda {

inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Driver API results (entry points from driver_api.h).
absl::Status CuStatus(CUresult res, absl::string_view what);

}  // namespace wsync::cuda

#define WSYNC_CUDA_RETURN_IF_ERROR(call, what)                                   \
  do {                                                                           \
    ::absl::Status wsync_cuda_status_ = ::wsync::cuda::CudaStatus((call), (what)); \
    if (!wsync_cuda_status_.ok()) return wsync_cuda_status_;                     \
  } while (0)

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_STATUS_H_
