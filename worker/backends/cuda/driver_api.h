// The few CUDA driver API entry points wsync uses, resolved at run time
// through the runtime (cudaGetDriverEntryPointByVersion) instead of linking
// libcuda: binaries then start on machines without a GPU driver (the build
// machine, CI), where GPU tests skip themselves.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_DRIVER_API_H_
#define WSYNC_WORKER_BACKENDS_CUDA_DRIVER_API_H_

#include <cuda.h>

#include "absl/status/statusor.h"

namespace wsync::cuda {

struct DriverApi {
  CUresult (*cuPointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                          unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                             CUmemAllocationHandleType) = nullptr;
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long) = nullptr;
};

// Loaded once; an error when the driver is missing or too old.
absl::StatusOr<const DriverApi*> GetDriverApi();

// "CUDA_ERROR_X (text)" for a driver result.
std::string DriverErrorText(CUresult r);

// Pinned device memory of GPU `device`: the properties cuMemCreate,
// cuMemGetAllocationGranularity and cuMemSetAccess (its location) take.
inline CUmemAllocationProp DeviceAllocationProp(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_DRIVER_API_H_
