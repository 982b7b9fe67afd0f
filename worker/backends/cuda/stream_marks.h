// Labelled points in the CUDA backend's stream work, for diagnostics: the
// data ops mark the end of each pack / unpack / copy call ("pack", "unpack",
// "copy"), the peer writer its puts ("put_issue", "put", "put_ce") and the
// NCCL transport each posted round ("nccl"), each on the stream the work was
// issued to. A tool that wants to see when that work finished on the device
// installs one process-wide observer (bench/gpu/device_timeline.h records a
// CUDA event per mark). With none installed a mark costs one atomic load.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_STREAM_MARKS_H_
#define WSYNC_WORKER_BACKENDS_CUDA_STREAM_MARKS_H_

#include <cuda_runtime_api.h>

#include <atomic>

namespace wsync::cuda {

class StreamMarkObserver {
 public:
  virtual ~StreamMarkObserver() = default;
  // Called on the issuing thread, right after the marked work was issued to
  // `stream`; `label` is a string literal. Must be thread-safe.
  virtual void Mark(const char* label, cudaStream_t stream) = 0;
};

namespace internal {
extern std::atomic<StreamMarkObserver*> stream_mark_observer;
}  // namespace internal

// Installs `observer` (not owned; it must outlive every mark), or removes the
// one installed with nullptr.
void SetStreamMarkObserver(StreamMarkObserver* observer);

inline void StreamMark(const char* label, cudaStream_t stream) {
  if (StreamMarkObserver* o = internal::stream_mark_observer.load(std::memory_order_acquire)) {
    o->Mark(label, stream);
  }
}

// Marks when the scope ends, whichever way it returns.
class StreamMarkOnExit {
 public:
  StreamMarkOnExit(const char* label, cudaStream_t stream) : label_(label), stream_(stream) {}
  ~StreamMarkOnExit() { StreamMark(label_, stream_); }
  StreamMarkOnExit(const StreamMarkOnExit&) = delete;
  StreamMarkOnExit& operator=(const StreamMarkOnExit&) = delete;

 private:
  const char* label_;
  cudaStream_t stream_;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_STREAM_MARKS_H_
