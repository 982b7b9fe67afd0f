#include "worker/backends/cuda/cuda_swap_arena.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::cuda {
namespace {

CUdeviceptr Ptr(void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

// The arena's addresses are aligned to the largest power of two <= its size,
// at most 1 GiB (and at least the granularity): remapping an 8 GiB arena
// took 0.61 ms aligned to 1 GiB against 0.80 ms at the 2 MiB granularity
// (H200, bench/results/gpu-2026-11-27-session18.md), the driver's page-table
// work depending on the range's alignment.
size_t ReserveAlignment(int64_t size, size_t granularity) {
  size_t align = size_t{1} << 30;
  while (align > granularity && static_cast<int64_t>(align) > size) align >>= 1;
  return align > granularity ? align : granularity;
}

class CudaSwapArena : public plane::SwapArena {
 public:
  CudaSwapArena(std::string name, CUdeviceptr base, int64_t bytes, int device, const DriverApi* api)
      : SwapArena(std::move(name), reinterpret_cast<void*>(static_cast<uintptr_t>(base)), bytes),
        device_(device),
        api_(api) {}
  ~CudaSwapArena() override {
    DeviceGuard guard(device_);
    if (mapped_) Log(api_->cuMemUnmap(Ptr(base()), Size()), "cuMemUnmap");
    if (handle_ != 0) Log(api_->cuMemRelease(handle_), "cuMemRelease");
    Log(api_->cuMemAddressFree(Ptr(base()), Size()), "cuMemAddressFree");
  }

  int device() const override { return device_; }

  absl::Status WaitForDevice() override {
    DeviceGuard guard(device_);
    WSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(),
                               Describe() + ": waiting for the device's queued work");
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewTwin(
      const std::string& name) const override {
    return NewCudaSwapArena(device_, bytes(), name);
  }

  // Allocates the physical memory and maps it (construction's second half).
  absl::Status Back() {
    const CUmemAllocationProp prop = DeviceAllocationProp(device_);
    RETURN_IF_ERROR(Cu(api_->cuMemCreate(&handle_, Size(), &prop, 0), "cuMemCreate"));
    RETURN_IF_ERROR(MapAt(Ptr(base()), handle_));
    mapped_ = true;
    return absl::OkStatus();
  }

  // After DoBeginSwap and a failed DoFinishSwap: each range back on its own
  // memory.
  absl::Status UndoSwap(plane::SwapArena& other) override {
    auto* twin = static_cast<CudaSwapArena*>(&other);
    DeviceGuard guard(device_);
    Unmap();
    twin->Unmap();
    std::swap(handle_, twin->handle_);
    const absl::Status back = MapBoth(*twin);
    // A range left unmapped faults on any access: nothing may touch it.
    if (!mapped_) MarkUnusable();
    if (!twin->mapped_) twin->MarkUnusable();
    if (back.ok()) return back;
    return absl::Status(back.code(),
                        absl::StrCat("undoing it failed too (", back.message(), "): ",
                                     !mapped_ ? "both arenas are" : "the twin is", " unusable"));
  }

  // The live range is unmapped, then mapped on the twin's memory (which the
  // twin's range keeps mapping until DoFinishSwap): only this range's page
  // tables change inside the pause, half of the exchange's driver work.
  absl::Status DoBeginSwap(plane::SwapArena& other) override {
    auto* twin = dynamic_cast<CudaSwapArena*>(&other);
    if (twin == nullptr || twin == this || twin->bytes() != bytes() || twin->device_ != device_) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot swap ", Describe(), " with ", other.Describe(),
                       ": a twin must be another CUDA arena of the same device and size"));
    }
    DeviceGuard guard(device_);
    const std::string what = absl::StrCat("swapping ", Describe(), " with ", twin->Describe());
    // Work already queued on the device (the owner's kernels reading the
    // live weights, any stream) ends before the memory moves.
    WSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), what + ": cudaDeviceSynchronize");
    RETURN_IF_ERROR(Cu(api_->cuMemUnmap(Ptr(base()), Size()), what + ": cuMemUnmap (live)"));
    mapped_ = false;
    if (absl::Status s = MapAt(Ptr(base()), twin->handle_); !s.ok()) return Restore(what, s);
    mapped_ = true;
    std::swap(handle_, twin->handle_);
    return absl::OkStatus();
  }

  // The twin's range onto its new memory; on error it is left unmapped.
  absl::Status DoFinishSwap(plane::SwapArena& other) override {
    auto* twin = static_cast<CudaSwapArena*>(&other);
    DeviceGuard guard(device_);
    twin->Unmap();
    RETURN_IF_ERROR(twin->MapAt(Ptr(twin->base()), twin->handle_));
    twin->mapped_ = true;
    return absl::OkStatus();
  }

 protected:
  const char* kind() const override { return "cuda"; }

 private:
  size_t Size() const { return static_cast<size_t>(bytes()); }
  absl::Status Cu(CUresult r, const std::string& call) const {
    return CuStatus(r, absl::StrCat(Describe(), " on device ", device_, ": ", call));
  }
  static void Log(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS) spdlog::error("wsync cuda arena: {}: {}", call, DriverErrorText(r));
  }
  // Maps `handle` (Size() bytes) at `at`, read-write for the device; on
  // error `at` is left unmapped.
  absl::Status MapAt(CUdeviceptr at, CUmemGenericAllocationHandle handle) const {
    RETURN_IF_ERROR(Cu(api_->cuMemMap(at, Size(), 0, handle, 0), "cuMemMap"));
    CUmemAccessDesc access{};
    access.location = DeviceAllocationProp(device_).location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    absl::Status s = Cu(api_->cuMemSetAccess(at, Size(), &access, 1), "cuMemSetAccess");
    if (!s.ok()) Log(api_->cuMemUnmap(at, Size()), "cuMemUnmap (after cuMemSetAccess failed)");
    return s;
  }
  // This arena on handle_, then `twin` on its handle_.
  absl::Status MapBoth(CudaSwapArena& twin) {
    RETURN_IF_ERROR(MapAt(Ptr(base()), handle_));
    mapped_ = true;
    RETURN_IF_ERROR(twin.MapAt(Ptr(twin.base()), twin.handle_));
    twin.mapped_ = true;
    return absl::OkStatus();
  }
  void Unmap() {
    if (mapped_) Log(api_->cuMemUnmap(Ptr(base()), Size()), "cuMemUnmap");
    mapped_ = false;
  }
  // After the live range was unmapped and mapping it on the twin's memory
  // failed: maps its own memory back.
  absl::Status Restore(const std::string& what, const absl::Status& failed) {
    absl::Status back = MapAt(Ptr(base()), handle_);
    if (back.ok()) {
      mapped_ = true;
    } else {
      MarkUnusable();  // unmapped: any access would fault
    }
    return absl::Status(failed.code(),
                        absl::StrCat(what, ": ", failed.message(),
                                     back.ok() ? "; both keep their memory"
                                               : absl::StrCat("; remapping the live arena failed "
                                                              "too: ",
                                                              back.message())));
  }

  const int device_;
  const DriverApi* const api_;
  CUmemGenericAllocationHandle handle_ = 0;
  bool mapped_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewCudaSwapArena(int device, int64_t bytes,
                                                                   const std::string& name) {
  const std::string what = absl::StrCat("cuda arena '", name, "' on device ", device);
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  DeviceGuard guard(device);
  WSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), absl::StrCat(what, ": cudaSetDevice"));
  const CUmemAllocationProp prop = DeviceAllocationProp(device);
  size_t granularity = 0;
  RETURN_IF_ERROR(CuStatus(
      api->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      absl::StrCat(what, ": cuMemGetAllocationGranularity")));
  ASSIGN_OR_RETURN(
      int64_t size,
      plane::RoundArenaBytes(bytes, static_cast<int64_t>(granularity ? granularity : 1), what));
  CUdeviceptr base = 0;
  RETURN_IF_ERROR(CuStatus(api->cuMemAddressReserve(&base, static_cast<size_t>(size),
                                                    ReserveAlignment(size, granularity), 0, 0),
                           absl::StrCat(what, ": reserving ", size, " bytes of addresses")));
  auto arena = std::make_unique<CudaSwapArena>(name, base, size, device, api);
  RETURN_IF_ERROR(arena->Back());
  return std::unique_ptr<plane::SwapArena>(std::move(arena));
}

}  // namespace wsync::cuda
