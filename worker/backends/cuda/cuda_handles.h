// RAII owners of CUDA resources. Each remembers its device so that it is
// destroyed with that device current, whatever the caller's current device is.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_HANDLES_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_HANDLES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace wsync::cuda {

// Makes `device` current for the guard's lifetime, then restores the previous.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class Stream {
 public:
  // A non-blocking stream (no implicit sync with the legacy default stream).
  static absl::StatusOr<Stream> Create(int device, int priority = 0);
  Stream() = default;
  Stream(Stream&& o) noexcept { *this = std::move(o); }
  Stream& operator=(Stream&& o) noexcept;
  ~Stream() { Reset(); }

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  absl::Status Synchronize() const;
  void Reset();

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

class Event {
 public:
  static absl::StatusOr<Event> Create(int device, bool timing = false);
  Event() = default;
  Event(Event&& o) noexcept { *this = std::move(o); }
  Event& operator=(Event&& o) noexcept;
  ~Event() { Reset(); }

  cudaEvent_t get() const { return event_; }
  absl::Status Record(cudaStream_t stream) const;
  absl::Status Synchronize() const;
  // True once every piece of work captured by the last Record has finished.
  absl::StatusOr<bool> Query() const;
  void Reset();

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

// Device memory from cudaMalloc (never managed memory).
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(int device, size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = -1;
};

// Page-locked host memory (cudaMallocHost), for asynchronous uploads.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  ~PinnedBuffer() { Reset(); }

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Number of CUDA devices visible; an error when the driver is unusable.
absl::StatusOr<int> DeviceCount();

// "GPU-xxxxxxxx-xxxx-..." as nvidia-smi prints it.
absl::StatusOr<std::string> DeviceUuid(int device);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_HANDLES_H_
