// What one more step inside a round costs (docs/relay-steps.md: the step
// latency l of LinkModel.step_latency_seconds): B bytes moved as S
// stream-ordered NCCL groups, one chunk of B / S per group, as a worker's
// transport runs a round of S steps, for S = 1, 2, 4, ... One process, raw
// NCCL, CUDA events around each run; medians over --iters.
//  * 1 GPU ("self"): each step sends a chunk to the GPU itself, NCCL's local
//    path: the GPU-side cost of a further group (launch, NCCL's kernel), no
//    link.
//  * n >= 2 GPUs ("chain"): a relay chain 0 -> 1 -> ... -> n-1 within one
//    round; in step s GPU r forwards chunk s - r to GPU r + 1 (received in
//    step s - 1), so S chunks take S + n - 2 steps.
// Per-step cost l fitted from two runs, each step costing its chunk's time
// at the S = 1 rate plus l: with h = n - 1 hops (h = 1 on one GPU) and
// k = S + h - 1 steps, t(1) = h (T + l) and t(S) = k (T / S + l), so
// l = (S h t(S) - k t(1)) / (h k (S - 1)); for h = 1, (t(S) - t(1)) / (S - 1).
// Prints one RESULT line (JSON) per S.
// --barrier 1: the host waits for every GPU after each step, so the steps
// are rounds and the per-step figure a round's latency (the planner's L
// against its step latency l).
//   wsync_bench_step_latency [--mib 32] [--iters 20] [--gpus n] [--barrier 0|1]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "exit_on_error.h"  // beside this file: nvcc builds it alone

#define CK(x) WSYNC_EXIT_ON_ERROR(x, cudaSuccess, cudaGetErrorString)
#define NK(x) WSYNC_EXIT_ON_ERROR(x, ncclSuccess, ncclGetErrorString)

namespace {

struct Gpu {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  char* buf = nullptr;  // the tensor: chunks arrive and leave from here
  char* src = nullptr;  // GPU 0 in chain mode, every GPU in self mode
};

// One run of `chunks` chunks of `chunk` bytes; returns milliseconds on GPU 0's
// stream from before the first step to after the last GPU's last step.
// With `barrier`, the host waits for every GPU's stream after each step, as
// between two rounds: the per-step figure is then a round's latency.
float Run(std::vector<Gpu>& g, int chunks, size_t chunk, bool barrier) {
  const int n = static_cast<int>(g.size());
  const int steps = n == 1 ? chunks : chunks + n - 2;
  cudaEvent_t begin, end;
  CK(cudaSetDevice(0));
  CK(cudaEventCreate(&begin));
  CK(cudaEventCreate(&end));
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaStreamSynchronize(g[r].stream));
  }
  CK(cudaSetDevice(0));
  CK(cudaEventRecord(begin, g[0].stream));
  for (int s = 0; s < steps; ++s) {
    NK(ncclGroupStart());
    if (n == 1) {
      NK(ncclSend(g[0].src + s * chunk, chunk, ncclUint8, 0, g[0].comm, g[0].stream));
      NK(ncclRecv(g[0].buf + s * chunk, chunk, ncclUint8, 0, g[0].comm, g[0].stream));
    }
    for (int r = 0; n > 1 && r + 1 < n; ++r) {
      const int k = s - r;  // the chunk GPU r sends on in step s
      if (k < 0 || k >= chunks) continue;
      const char* from = (r == 0 ? g[0].src : g[r].buf) + k * chunk;
      NK(ncclSend(from, chunk, ncclUint8, r + 1, g[r].comm, g[r].stream));
      NK(ncclRecv(g[r + 1].buf + k * chunk, chunk, ncclUint8, r, g[r + 1].comm, g[r + 1].stream));
    }
    NK(ncclGroupEnd());
    for (int r = 0; barrier && r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamSynchronize(g[r].stream));
    }
  }
  // GPU 0's end waits for every GPU's last step.
  for (int r = 1; r < n; ++r) {
    cudaEvent_t done;
    CK(cudaSetDevice(r));
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CK(cudaEventRecord(done, g[r].stream));
    CK(cudaSetDevice(0));
    CK(cudaStreamWaitEvent(g[0].stream, done, 0));
    CK(cudaEventDestroy(done));
  }
  CK(cudaSetDevice(0));
  CK(cudaEventRecord(end, g[0].stream));
  CK(cudaEventSynchronize(end));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, begin, end));
  CK(cudaEventDestroy(begin));
  CK(cudaEventDestroy(end));
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 32;
  int iters = 20, gpus = 0;
  bool barrier = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--mib")) mib = strtoull(argv[i + 1], nullptr, 10);
    if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--gpus")) gpus = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--barrier")) barrier = atoi(argv[i + 1]) != 0;
  }
  int visible = 0;
  CK(cudaGetDeviceCount(&visible));
  const int n = gpus > 0 ? std::min(gpus, visible) : visible;
  const size_t bytes = mib << 20;
  std::vector<Gpu> g(n);
  std::vector<int> devs(n);
  std::vector<ncclComm_t> comms(n);
  for (int r = 0; r < n; ++r) devs[r] = r;
  NK(ncclCommInitAll(comms.data(), n, devs.data()));
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    g[r].comm = comms[r];
    CK(cudaStreamCreateWithFlags(&g[r].stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&g[r].buf, bytes));
    CK(cudaMalloc(&g[r].src, bytes));
    CK(cudaMemset(g[r].src, r + 1, bytes));
  }
  int version = 0;
  NK(ncclGetVersion(&version));
  const char* mode = n == 1 ? "self" : "chain";
  float base_ms = 0;
  for (int chunks = 1; chunks <= 64; chunks *= 2) {
    const size_t chunk = bytes / chunks;
    Run(g, chunks, chunk, barrier);  // warm-up
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) t.push_back(Run(g, chunks, chunk, barrier));
    std::sort(t.begin(), t.end());
    const float med = t[t.size() / 2];
    const int steps = n == 1 ? chunks : chunks + n - 2;
    double per_step_us = 0;
    if (chunks == 1) {
      base_ms = med;
    } else {
      const double h = n == 1 ? 1.0 : n - 1.0;
      per_step_us =
          1e3 * (chunks * h * med - steps * base_ms) / (h * steps * (chunks - 1.0));
    }
    printf(
        "RESULT {\"mode\":\"%s\",\"barrier\":%d,\"gpus\":%d,\"mib\":%zu,\"chunks\":%d,\"steps\":%d,"
        "\"median_ms\":%.4f,\"min_ms\":%.4f,\"per_step_us\":%.2f,\"nccl\":%d}\n",
        mode, barrier ? 1 : 0, n, mib, chunks, steps, med, t.front(), per_step_us, version);
  }
  for (int r = 0; r < n; ++r) NK(ncclCommDestroy(g[r].comm));
  return 0;
}
