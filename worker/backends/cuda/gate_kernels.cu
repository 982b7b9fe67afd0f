#include "worker/backends/cuda/gate_kernels.h"

namespace wsync::cuda {
namespace {

__device__ unsigned long long GlobalNanos() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void GateSignalKernel(GateSignalArgs a) {
  __threadfence_system();  // what this GPU wrote before, then the values
  for (int i = 0; i < a.count; ++i) {
    *reinterpret_cast<volatile unsigned long long*>(a.slot[i]) = a.value[i];
  }
  __threadfence_system();
}

__global__ void GateWaitKernel(GateWaitArgs a) {
  const unsigned long long start = GlobalNanos();
  for (;;) {
    bool all = true;
    for (int i = 0; i < a.count && all; ++i) {
      all = *reinterpret_cast<const volatile unsigned long long*>(a.slot[i]) >= a.at_least[i];
    }
    if (all) break;
    if (static_cast<long long>(GlobalNanos() - start) >= a.timeout_ns) {
      volatile unsigned long long* n = a.timed_out;
      *n = *n + 1;
      break;
    }
    __nanosleep(256);
  }
  __threadfence_system();
}

}  // namespace

cudaError_t LoadGateKernels() {
  cudaFuncAttributes attributes;
  const cudaError_t err = cudaFuncGetAttributes(&attributes, GateSignalKernel);
  if (err != cudaSuccess) return err;
  return cudaFuncGetAttributes(&attributes, GateWaitKernel);
}

cudaError_t LaunchGateSignal(const GateSignalArgs& args, cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  GateSignalKernel<<<1, 1, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchGateWait(const GateWaitArgs& args, cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  GateWaitKernel<<<1, 1, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace wsync::cuda
