#include "worker/backends/cuda/cuda_handles.h"

#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::cuda {
namespace {

// Destructors cannot return a Status; a failed release is logged, never thrown.
void LogIfError(cudaError_t err, const char* what) {
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    spdlog::error("wsync cuda: {} failed: {}", what, cudaGetErrorString(err));
  }
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  // A thread that never used CUDA reports device 0 without having a context
  // there; restoring "device 0" would create GPU 0's primary context (a few
  // hundred MiB on a GPU this process may have no business with). Such a
  // thread keeps `device` instead.
  if (auto api = GetDriverApi(); api.ok()) {
    CUcontext current = nullptr;
    if ((*api)->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == nullptr) previous_ = -1;
  }
  if (device >= 0 && device != previous_) LogIfError(cudaSetDevice(device), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) LogIfError(cudaSetDevice(previous_), "cudaSetDevice(restore)");
}

absl::StatusOr<Stream> Stream::Create(int device, int priority) {
  DeviceGuard guard(device);
  Stream s;
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&s.stream_, cudaStreamNonBlocking, priority),
      absl::StrCat("cudaStreamCreate on device ", device));
  s.device_ = device;
  return s;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Reset();
    stream_ = std::exchange(o.stream_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

absl::Status Stream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(stream_),
                    absl::StrCat("cudaStreamSynchronize on device ", device_));
}

void Stream::Reset() {
  if (stream_ == nullptr) return;
  DeviceGuard guard(device_);
  LogIfError(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  stream_ = nullptr;
  device_ = -1;
}

absl::StatusOr<Event> Event::Create(int device, bool timing) {
  DeviceGuard guard(device);
  Event e;
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming),
      absl::StrCat("cudaEventCreate on device ", device));
  e.device_ = device;
  return e;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Reset();
    event_ = std::exchange(o.event_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

absl::Status Event::Record(cudaStream_t stream) const {
  return CudaStatus(cudaEventRecord(event_, stream),
                    absl::StrCat("cudaEventRecord on device ", device_));
}

absl::Status Event::Synchronize() const {
  return CudaStatus(cudaEventSynchronize(event_),
                    absl::StrCat("cudaEventSynchronize on device ", device_));
}

absl::StatusOr<bool> Event::Query() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  if (err == cudaSuccess) return true;
  return CudaStatus(err, absl::StrCat("cudaEventQuery on device ", device_));
}

void Event::Reset() {
  if (event_ == nullptr) return;
  DeviceGuard guard(device_);
  LogIfError(cudaEventDestroy(event_), "cudaEventDestroy");
  event_ = nullptr;
  device_ = -1;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  DeviceGuard guard(device);
  DeviceBuffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.ptr_, bytes),
                             absl::StrFormat("cudaMalloc of %d bytes on device %d", bytes, device));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) {
    DeviceGuard guard(device_);
    LogIfError(cudaFree(ptr_), "cudaFree");
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaMallocHost(&b.ptr_, bytes),
                             absl::StrFormat("cudaMallocHost of %d bytes", bytes));
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (ptr_ != nullptr) LogIfError(cudaFreeHost(ptr_), "cudaFreeHost");
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  return n;
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp prop;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device),
                             absl::StrCat("cudaGetDeviceProperties(", device, ")"));
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

}  // namespace wsync::cuda
