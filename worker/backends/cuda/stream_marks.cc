#include "worker/backends/cuda/stream_marks.h"

namespace wsync::cuda {

namespace internal {
std::atomic<StreamMarkObserver*> stream_mark_observer{nullptr};
}  // namespace internal

void SetStreamMarkObserver(StreamMarkObserver* observer) {
  internal::stream_mark_observer.store(observer, std::memory_order_release);
}

}  // namespace wsync::cuda
