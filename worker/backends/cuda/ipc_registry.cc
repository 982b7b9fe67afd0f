#include "worker/backends/cuda/ipc_registry.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::cuda {

std::string IpcTensorHandle::Serialize() const {
  return absl::StrCat(gpu_uuid, ":", absl::BytesToHexString(base_handle), ":", base_bytes, ":",
                      offset, ":", bytes);
}

absl::StatusOr<IpcTensorHandle> IpcTensorHandle::Parse(const std::string& text) {
  std::vector<std::string> f = absl::StrSplit(text, ':');
  IpcTensorHandle h;
  if (f.size() != 5 || f[1].size() != 2 * sizeof(cudaIpcMemHandle_t) ||
      !absl::SimpleAtoi(f[2], &h.base_bytes) || !absl::SimpleAtoi(f[3], &h.offset) ||
      !absl::SimpleAtoi(f[4], &h.bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed IPC tensor handle '", text, "'"));
  }
  h.gpu_uuid = f[0];
  h.base_handle = absl::HexStringToBytes(f[1]);
  return h;
}

absl::StatusOr<IpcTensorHandle> ExportTensor(const void* ptr, uint64_t bytes,
                                             const std::string& name) {
  auto api_or = GetDriverApi();
  if (!api_or.ok()) return api_or.status();
  const DriverApi& api = **api_or;
  const auto dptr = reinterpret_cast<CUdeviceptr>(ptr);
  CUmemorytype type{};
  unsigned int managed = 0;
  int ordinal = -1;
  CUresult r = api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr);
  if (r != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": not device memory (host or unregistered pointer)"));
  }
  if (api.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dptr) == CUDA_SUCCESS &&
      managed) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": managed (unified) memory cannot be exported"));
  }
  {
    absl::Status s =
        CuStatus(api.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr),
                 absl::StrCat("device of tensor ", name));
    if (!s.ok()) return s;
  }
  int legacy_ok = 0;
  if (api.cuPointerGetAttribute(&legacy_ok, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                dptr) == CUDA_SUCCESS &&
      !legacy_ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", name,
        " lives in cuMem (virtual memory API) memory, which legacy CUDA IPC cannot export. "
        "This comes from PyTorch's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or vLLM's "
        "sleep mode (enable_sleep_mode / CuMemAllocator): turn those off for the weights "
        "wsync writes (POSIX file-descriptor handles over SCM_RIGHTS are not supported yet)"));
  }
  // cuMemGetAddressRange and cudaIpcGetMemHandle work in the calling thread's
  // current context: select the tensor's device explicitly, even when it is
  // the selected one already (a thread that only allocated through the
  // runtime may have no current driver context: CUDA_ERROR_NOT_FOUND).
  DeviceGuard guard(ordinal);
  WSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal),
                             absl::StrCat("selecting device ", ordinal, " of tensor ", name));
  CUdeviceptr base = 0;
  size_t base_bytes = 0;
  {
    absl::Status s = CuStatus(api.cuMemGetAddressRange(&base, &base_bytes, dptr),
                              absl::StrCat("allocation range of tensor ", name));
    if (!s.ok()) return s;
  }
  const uint64_t offset = dptr - base;
  if (offset + bytes > base_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", bytes,
                                                   " bytes at offset ", offset,
                                                   " run past its allocation of ", base_bytes));
  }
  cudaIpcMemHandle_t handle;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)),
                             absl::StrCat("cudaIpcGetMemHandle for tensor ", name));
  auto uuid = DeviceUuid(ordinal);
  if (!uuid.ok()) return uuid.status();
  IpcTensorHandle h;
  h.gpu_uuid = *uuid;
  h.base_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  h.base_bytes = base_bytes;
  h.offset = offset;
  h.bytes = bytes;
  return h;
}

absl::StatusOr<std::vector<std::string>> WritableDeviceUuids(int device) {
  int count = 0;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count), "device count");
  std::vector<std::string> out;
  for (int d = 0; d < count; ++d) {
    int can = d == device ? 1 : 0;
    if (d != device) {
      WSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device, d),
                                 absl::StrCat("peer access from device ", device, " to ", d));
    }
    if (!can) continue;
    auto uuid = DeviceUuid(d);
    if (!uuid.ok()) return uuid.status();
    out.push_back(*uuid);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<IpcRegistry>> IpcRegistry::Create(int device) {
  std::unique_ptr<IpcRegistry> reg(new IpcRegistry());
  reg->device_ = device;
  auto uuid = DeviceUuid(device);
  if (!uuid.ok()) return uuid.status();
  reg->uuid_ = *uuid;
  auto writable = WritableDeviceUuids(device);
  if (!writable.ok()) return writable.status();
  reg->writable_uuids_ = *std::move(writable);
  return reg;
}

IpcRegistry::~IpcRegistry() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  for (auto& [key, m] : mappings_) {
    const cudaError_t err = cudaIpcCloseMemHandle(m.base);
    if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
      spdlog::error("wsync ipc: cudaIpcCloseMemHandle: {}", cudaGetErrorString(err));
    }
  }
}

size_t IpcRegistry::num_mappings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mappings_.size();
}

int64_t IpcRegistry::slow_peer_mappings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slow_peer_mappings_;
}

absl::StatusOr<void*> IpcRegistry::Open(const IpcTensorHandle& h, const std::string& name,
                                        bool peer) {
  if (h.gpu_uuid != uuid_ && !peer) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " lives on ", h.gpu_uuid,
                                                   " but this registry maps device ", device_, " (",
                                                   uuid_, ")"));
  }
  if (peer && std::find(writable_uuids_.begin(), writable_uuids_.end(), h.gpu_uuid) ==
                  writable_uuids_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", name, " lives on ", h.gpu_uuid, ", which device ", device_, " (",
                     uuid_, ") cannot write over peer access (or this process does not see it)"));
  }
  if (h.base_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": IPC handle has ", h.base_handle.size(), " bytes"));
  }
  if (h.offset > h.base_bytes || h.bytes > h.base_bytes - h.offset) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": range [", h.offset, ", +",
                                                   h.bytes, ") outside its allocation of ",
                                                   h.base_bytes, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.find(h.base_handle);
  if (it == mappings_.end()) {
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, h.base_handle.data(), sizeof(handle));
    void* base = nullptr;
    DeviceGuard guard(device_);
    WSYNC_CUDA_RETURN_IF_ERROR(
        cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
        absl::StrCat("cudaIpcOpenMemHandle for tensor ", name,
                     " (legacy IPC needs the owner's PID namespace: shareProcessNamespace or "
                     "hostPID in Kubernetes)"));
    // The owner's claimed size decides which ranges are accepted: check it
    // against what was mapped, or a wrong claim would let a sync write past
    // the allocation.
    auto api = GetDriverApi();
    CUdeviceptr mapped_base = 0;
    size_t mapped_bytes = 0;
    absl::Status size_ok =
        api.ok() ? CuStatus((*api)->cuMemGetAddressRange(&mapped_base, &mapped_bytes,
                                                         reinterpret_cast<CUdeviceptr>(base)),
                            absl::StrCat("size of the allocation of tensor ", name))
                 : api.status();
    if (size_ok.ok() && mapped_bytes != h.base_bytes) {
      size_ok = absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, ": the owner says its allocation has ", h.base_bytes,
                       " bytes, the mapped allocation has ", mapped_bytes));
    }
    if (!size_ok.ok()) {
      cudaIpcCloseMemHandle(base);
      return size_ok;
    }
    it = mappings_.emplace(h.base_handle, Mapping{base, h.base_bytes}).first;
    if (peer && SlowForPeerWrites(h.base_bytes)) {
      ++slow_peer_mappings_;
      spdlog::warn(
          "wsync ipc: tensor {} lives in an allocation of {} bytes, not a multiple of 64 KiB; "
          "direct writes into it run about 25% slower (allocate weights in multiples of 2 MiB, "
          "as PyTorch's caching allocator does)",
          name, h.base_bytes);
    }
  } else if (it->second.bytes != h.base_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": allocation size ", h.base_bytes, " differs from the ",
                     it->second.bytes, " bytes mapped for the same handle"));
  }
  ++it->second.holds;
  return static_cast<char*>(it->second.base) + h.offset;
}

void IpcRegistry::Release(const IpcTensorHandle& h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.find(h.base_handle);
  if (it == mappings_.end() || --it->second.holds > 0) return;
  DeviceGuard guard(device_);
  const cudaError_t err = cudaIpcCloseMemHandle(it->second.base);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    spdlog::error("wsync ipc: cudaIpcCloseMemHandle: {}", cudaGetErrorString(err));
  }
  mappings_.erase(it);
}

}  // namespace wsync::cuda
