// The kernels of the CUDA peer writer's put gates (PeerWriter::GatePuts /
// SignalAfterPuts): one thread each, launched on the put stream, so stream
// order places them between puts. A signal stores 8-byte values into peers'
// mailbox slots (device memory mapped by CUDA IPC) after a system-wide
// fence; a wait polls slots of this GPU's own mailbox until each holds at
// least its value, or until `timeout_ns` of the GPU's global timer passed
// since it started, then adds one to *timed_out (mapped pinned host memory,
// written by these kernels only, one at a time on one stream).
//
// LoadGateKernels loads both before any is launched: under CUDA's lazy
// module loading (the default since CUDA 12) a kernel's first launch waits
// for the kernels running on its device, so a signal launched for the
// first time while a wait of the same process spins on that device ran
// only once the wait timed out (seen on H200: the gate conformance case
// with two writers on one GPU took its full 30 s timeout).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_GATE_KERNELS_H_
#define WSYNC_WORKER_BACKENDS_CUDA_GATE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wsync::cuda {

inline constexpr int kMaxGateSlots = 32;  // per launch; callers launch more

struct GateSignalArgs {
  unsigned long long* slot[kMaxGateSlots];
  unsigned long long value[kMaxGateSlots];
  int count = 0;
};

struct GateWaitArgs {
  const unsigned long long* slot[kMaxGateSlots];
  unsigned long long at_least[kMaxGateSlots];
  int count = 0;
  long long timeout_ns = 0;
  unsigned long long* timed_out = nullptr;
};

cudaError_t LoadGateKernels();
cudaError_t LaunchGateSignal(const GateSignalArgs& args, cudaStream_t stream);
cudaError_t LaunchGateWait(const GateWaitArgs& args, cudaStream_t stream);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_GATE_KERNELS_H_
