#include "worker/backends/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_status.h"

namespace wsync::cuda {
namespace {

template <typename Fn>
absl::Status Load(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  // 12000: the ABI version of every symbol used here (all exist since 12.0).
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver entry point ", name, " unavailable (", cudaGetErrorString(err), ")"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

absl::StatusOr<DriverApi> LoadAll() {
  DriverApi api;
  absl::Status s;
  auto load = [&](const char* name, auto* fn) {
    if (s.ok()) s = Load(name, fn);
  };
  load("cuPointerGetAttribute", &api.cuPointerGetAttribute);
  load("cuMemGetAddressRange", &api.cuMemGetAddressRange);
  load("cuGetErrorName", &api.cuGetErrorName);
  load("cuGetErrorString", &api.cuGetErrorString);
  load("cuMemCreate", &api.cuMemCreate);
  load("cuMemRelease", &api.cuMemRelease);
  load("cuMemAddressReserve", &api.cuMemAddressReserve);
  load("cuMemAddressFree", &api.cuMemAddressFree);
  load("cuMemMap", &api.cuMemMap);
  load("cuMemUnmap", &api.cuMemUnmap);
  load("cuMemSetAccess", &api.cuMemSetAccess);
  load("cuMemGetAllocationGranularity", &api.cuMemGetAllocationGranularity);
  load("cuCtxGetCurrent", &api.cuCtxGetCurrent);
  load("cuMemImportFromShareableHandle", &api.cuMemImportFromShareableHandle);
  load("cuMemExportToShareableHandle", &api.cuMemExportToShareableHandle);
  if (!s.ok()) return s;
  return api;
}

}  // namespace

absl::StatusOr<const DriverApi*> GetDriverApi() {
  static const absl::StatusOr<DriverApi>* api = new absl::StatusOr<DriverApi>(LoadAll());
  if (!api->ok()) return api->status();
  return &**api;
}

std::string DriverErrorText(CUresult r) {
  auto api = GetDriverApi();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.ok()) {
    (*api)->cuGetErrorName(r, &name);
    (*api)->cuGetErrorString(r, &text);
  }
  return absl::StrCat(name ? name : "CUresult ", name ? "" : absl::StrCat(static_cast<int>(r)),
                      " (", text ? text : "?", ")");
}

absl::Status CuStatus(CUresult res, absl::string_view what) {
  if (res == CUDA_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", DriverErrorText(res));
  if (res == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(msg);
  if (res == CUDA_ERROR_INVALID_VALUE) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

}  // namespace wsync::cuda
