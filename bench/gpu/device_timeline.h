// A diagnostic: when, on the GPU, each piece of a sync's work finished (local
// copies, puts, NCCL rounds: the CUDA backend's stream marks,
// worker/backends/cuda/stream_marks.h), and when the host issued it. The
// executor's host timings cannot tell a kernel that waited for SM slots from
// one that ran slowly; these device times can (sync_bench.cc --timeline).
//
// Off unless enabled: a mark then costs one atomic load. Marks past the
// capacity are dropped (and counted), never allocated on the way.
#ifndef WSYNC_BENCH_GPU_DEVICE_TIMELINE_H_
#define WSYNC_BENCH_GPU_DEVICE_TIMELINE_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/stream_marks.h"

namespace wsync::cuda {

class DeviceTimeline : public StreamMarkObserver {
 public:
  struct Entry {
    const char* label;
    double device_ms;  // completion on the device, since Begin
    double host_ms;    // when the host issued the mark, since Begin
  };
  // Turns the process-wide timeline on for `device` (installs it as the
  // stream-mark observer), with room for `capacity` marks per Begin. Once on,
  // later calls change nothing.
  static absl::Status Enable(int device, int capacity);
  // The enabled timeline, or null.
  static DeviceTimeline* Active() { return active_.load(std::memory_order_acquire); }

  // Starts a new timeline: its zero is when `stream` reaches this point.
  absl::Status Begin(cudaStream_t stream);
  // `label` must outlive Collect (a string literal).
  void Mark(const char* label, cudaStream_t stream) override;
  // Waits for every mark since Begin.
  absl::StatusOr<std::vector<Entry>> Collect();
  int dropped() {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
  }
  ~DeviceTimeline() override;

 private:
  DeviceTimeline() = default;
  static std::atomic<DeviceTimeline*> active_;

  std::mutex mu_;
  int device_ = 0;
  Event base_;
  std::vector<Event> events_;
  std::vector<const char*> labels_;
  std::vector<double> host_ms_;
  std::chrono::steady_clock::time_point host_base_;
  int used_ = 0;
  int dropped_ = 0;
};

}  // namespace wsync::cuda

#endif  // WSYNC_BENCH_GPU_DEVICE_TIMELINE_H_
