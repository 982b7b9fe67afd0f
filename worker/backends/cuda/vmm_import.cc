#include "worker/backends/cuda/vmm_import.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::cuda {
namespace {

absl::StatusOr<uint64_t> Granularity(const DriverApi& api, int device) {
  const CUmemAllocationProp prop = DeviceAllocationProp(device);
  size_t granularity = 0;
  RETURN_IF_ERROR(CuStatus(
      api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      absl::StrCat("cuMemGetAllocationGranularity on device ", device)));
  return granularity == 0 ? 1 : granularity;
}

}  // namespace

absl::StatusOr<uint64_t> VmmRangeBytes(const v1::CudaVmm& vmm, const plane::FdBatch& fds,
                                       uint64_t granularity, const std::string& what) {
  if (vmm.chunks().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": CUDA virtual memory without chunks"));
  }
  uint64_t total = 0;
  for (int i = 0; i < vmm.chunks_size(); ++i) {
    const v1::CudaVmm::Chunk& c = vmm.chunks(i);
    if (fds.fd(c.fd_index()) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": chunk ", i, " names descriptor ",
                                                     c.fd_index(), " but batch ", fds.token(),
                                                     " holds ", fds.size()));
    }
    if (c.bytes() <= 0 || static_cast<uint64_t>(c.bytes()) % granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": chunk ", i, " has ", c.bytes(),
          " bytes, not a positive multiple of the allocation granularity (", granularity, ")"));
    }
    if (__builtin_add_overflow(total, static_cast<uint64_t>(c.bytes()), &total)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": chunk sizes overflow"));
    }
  }
  if (total > kMaxVmmRangeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": chunks of ", total,
                                                   " bytes in all, more than any GPU holds (",
                                                   kMaxVmmRangeBytes, ")"));
  }
  uint64_t end = 0;
  if (vmm.offset() < 0 || vmm.size() < 0 ||
      __builtin_add_overflow(static_cast<uint64_t>(vmm.offset()), static_cast<uint64_t>(vmm.size()),
                             &end) ||
      end > total) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": range [", vmm.offset(), ", +",
                                                   vmm.size(), ") outside its ", vmm.chunks_size(),
                                                   " chunks of ", total, " bytes"));
  }
  return total;
}

absl::StatusOr<std::shared_ptr<VmmMapping>> VmmMapping::Map(int device, const v1::CudaVmm& vmm,
                                                            const plane::FdBatch& fds,
                                                            const std::string& what) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  DeviceGuard guard(device);
  WSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), absl::StrCat(what, ": cudaSetDevice"));
  ASSIGN_OR_RETURN(uint64_t granularity, Granularity(*api, device));
  ASSIGN_OR_RETURN(uint64_t total, VmmRangeBytes(vmm, fds, granularity, what));
  CUdeviceptr base = 0;
  RETURN_IF_ERROR(CuStatus(api->cuMemAddressReserve(&base, total, granularity, 0, 0),
                           absl::StrCat(what, ": reserving ", total, " bytes of addresses")));
  std::shared_ptr<VmmMapping> mapping(new VmmMapping(device, base, total));
  RETURN_IF_ERROR(mapping->MapChunks(vmm, fds, what));
  CUmemAccessDesc access{};
  access.location = DeviceAllocationProp(device).location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  RETURN_IF_ERROR(CuStatus(api->cuMemSetAccess(base, total, &access, 1),
                           absl::StrCat(what, ": granting device ", device, " access")));
  return mapping;
}

absl::Status VmmMapping::MapChunks(const v1::CudaVmm& vmm, const plane::FdBatch& fds,
                                   const std::string& what) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  uint64_t offset = 0;
  for (int i = 0; i < vmm.chunks_size(); ++i) {
    const v1::CudaVmm::Chunk& c = vmm.chunks(i);
    const std::string chunk = absl::StrCat(what, ": chunk ", i, " (descriptor ", c.fd_index(), ", ",
                                           c.bytes(), " bytes)");
    CUmemGenericAllocationHandle handle = 0;
    void* os_handle = reinterpret_cast<void*>(static_cast<intptr_t>(fds.fd(c.fd_index())));
    RETURN_IF_ERROR(CuStatus(api->cuMemImportFromShareableHandle(
                                 &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                             absl::StrCat(chunk, ": cuMemImportFromShareableHandle")));
    const CUresult mapped = api->cuMemMap(base_ + offset, c.bytes(), 0, handle, 0);
    // The mapping holds the allocation from here on.
    const CUresult released = api->cuMemRelease(handle);
    RETURN_IF_ERROR(CuStatus(mapped, absl::StrCat(chunk,
                                                  ": cuMemMap (is the declared size "
                                                  "larger than the allocation?)")));
    mapped_.push_back(static_cast<uint64_t>(c.bytes()));
    offset += static_cast<uint64_t>(c.bytes());
    RETURN_IF_ERROR(CuStatus(released, absl::StrCat(chunk, ": cuMemRelease")));
  }
  return absl::OkStatus();
}

VmmMapping::~VmmMapping() {
  auto api = GetDriverApi();
  if (!api.ok()) return;
  DeviceGuard guard(device_);
  uint64_t offset = 0;
  for (uint64_t bytes : mapped_) {
    const CUresult r = (*api)->cuMemUnmap(base_ + offset, bytes);
    if (r != CUDA_SUCCESS) spdlog::error("wsync vmm: cuMemUnmap: {}", DriverErrorText(r));
    offset += bytes;
  }
  const CUresult r = (*api)->cuMemAddressFree(base_, reserved_);
  if (r != CUDA_SUCCESS) spdlog::error("wsync vmm: cuMemAddressFree: {}", DriverErrorText(r));
}

}  // namespace wsync::cuda
