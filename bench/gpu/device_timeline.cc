#include "bench/gpu/device_timeline.h"

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_status.h"

namespace wsync::cuda {

std::atomic<DeviceTimeline*> DeviceTimeline::active_{nullptr};

absl::Status DeviceTimeline::Enable(int device, int capacity) {
  static std::mutex enable_mu;
  std::lock_guard<std::mutex> lock(enable_mu);
  if (active_.load() != nullptr) return absl::OkStatus();
  if (capacity < 1) return absl::InvalidArgumentError("timeline capacity must be positive");
  auto base = Event::Create(device, /*timing=*/true);
  if (!base.ok()) return base.status();
  std::vector<Event> events;
  for (int i = 0; i < capacity; ++i) {
    auto ev = Event::Create(device, /*timing=*/true);
    if (!ev.ok()) return ev.status();
    events.push_back(std::move(*ev));
  }
  // Until exit; its destructor turns the timeline off first.
  static DeviceTimeline t;
  t.device_ = device;
  t.base_ = std::move(*base);
  t.events_ = std::move(events);
  t.labels_.assign(capacity, nullptr);
  t.host_ms_.assign(capacity, 0.0);
  active_.store(&t, std::memory_order_release);
  SetStreamMarkObserver(&t);
  return absl::OkStatus();
}

DeviceTimeline::~DeviceTimeline() {
  SetStreamMarkObserver(nullptr);
  active_.store(nullptr, std::memory_order_release);
}

absl::Status DeviceTimeline::Begin(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  used_ = 0;
  dropped_ = 0;
  host_base_ = std::chrono::steady_clock::now();
  return base_.Record(stream);
}

void DeviceTimeline::Mark(const char* label, cudaStream_t stream) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ == static_cast<int>(events_.size())) {
    ++dropped_;
    return;
  }
  if (!events_[used_].Record(stream).ok()) {
    (void)cudaGetLastError();  // or the next launch check would report it
    ++dropped_;
    return;
  }
  labels_[used_] = label;
  host_ms_[used_] = std::chrono::duration<double, std::milli>(now - host_base_).count();
  ++used_;
}

absl::StatusOr<std::vector<DeviceTimeline::Entry>> DeviceTimeline::Collect() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  if (absl::Status s = base_.Synchronize(); !s.ok()) return s;
  for (int i = 0; i < used_; ++i) {
    if (absl::Status s = events_[i].Synchronize(); !s.ok()) return s;
    float ms = 0;
    WSYNC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, base_.get(), events_[i].get()),
                               absl::StrCat("timeline mark ", i, " (", labels_[i], ")"));
    out.push_back({labels_[i], ms, host_ms_[i]});
  }
  return out;
}

}  // namespace wsync::cuda
