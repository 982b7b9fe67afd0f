// How fast could a colocated sync be if the sender wrote straight into the
// receiver's memory over NVLink (peer access) instead of packing, sending
// with NCCL and unpacking? One process, two GPUs, the Llama-3-8B colocated
// sizes per GPU: a 6.82 GB local copy plus a row-parallel half (1.21 GB,
// strided rows of the trainer's shard) into the other GPU.
//
//   wsync_bench_p2p_overlap [--iters 5]
//
// Prints RESULT lines: each part alone and both at once, with wsync's
// batched kernel (one launch per GPU) and with copy engines for the peer
// part (cudaMemcpy2DAsync).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu/bench_util.h"
#include "worker/cuda/batched_kernels.h"
#include "worker/cuda/piece_table.h"

namespace wsync::bench {
namespace {

constexpr int64_t kLocalBytes = 6822301696;
// down_proj-like rows: each GPU's row shard is [rows, 2 * kCols]; the peer
// takes the second half of every row.
constexpr int64_t kCols = 7168;
constexpr int64_t kRows = 1208225792 / (kCols * 2);

struct Gpu {
  void* local_src = nullptr;
  void* local_dst = nullptr;
  void* rows = nullptr;      // [kRows, 2 * kCols] bf16
  void* incoming = nullptr;  // [kRows, kCols] bf16, written by the peer
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;  // the copy engines' part, beside the kernel
  std::unique_ptr<cuda::BatchedKernels> kernels;
  cuda::PieceTable local, peer, both;
};

int Main(int iters) {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "needs 2 GPUs, sees %d\n", n);
    return 2;
  }
  Gpu g[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    int ok = 0;
    CK(cudaDeviceCanAccessPeer(&ok, d, 1 - d));
    if (!ok) {
      std::fprintf(stderr, "GPU %d cannot access GPU %d\n", d, 1 - d);
      return 2;
    }
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&g[d].local_src, kLocalBytes));
    CK(cudaMalloc(&g[d].local_dst, kLocalBytes));
    CK(cudaMalloc(&g[d].rows, kRows * kCols * 2 * 2));
    CK(cudaMalloc(&g[d].incoming, kRows * kCols * 2));
    CK(cudaMemset(g[d].local_src, 1, kLocalBytes));
    CK(cudaMemset(g[d].rows, 2, kRows * kCols * 2 * 2));
    CK(cudaStreamCreateWithFlags(&g[d].stream, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g[d].copy_stream, cudaStreamNonBlocking));
    auto k = cuda::BatchedKernels::Create(d);
    if (!k.ok()) return 4;
    g[d].kernels = std::move(*k);
  }
  const int64_t flat[] = {1};
  const int64_t local_shape[] = {kLocalBytes / 2};
  const int64_t rows_shape[] = {kRows, kCols};
  const int64_t rows_src[] = {2 * kCols, 1};
  const int64_t rows_dst[] = {kCols, 1};
  for (int d = 0; d < 2; ++d) {
    Gpu& me = g[d];
    char* second_half = static_cast<char*>(me.rows) + kCols * 2;
    auto add_local = [&](cuda::PieceTable& t) {
      return t.AddCopy({me.local_src, v1::BF16, flat}, {me.local_dst, v1::BF16, flat}, local_shape,
                       1, "local");
    };
    auto add_peer = [&](cuda::PieceTable& t) {
      return t.AddCopy({second_half, v1::BF16, rows_src}, {g[1 - d].incoming, v1::BF16, rows_dst},
                       rows_shape, 2, "peer");
    };
    if (!add_local(me.local).ok() || !add_peer(me.peer).ok() || !add_local(me.both).ok() ||
        !add_peer(me.both).ok()) {
      return 4;
    }
  }
  // mode 0: local copy, 1: peer writes (kernel), 2: both in one launch,
  // 3: peer writes by copy engine, 4: local kernel + peer copy engine.
  auto run = [&](int mode) -> double {
    std::vector<double> times;
    for (int it = 0; it < iters + 2; ++it) {
      const double t0 = Now();
      for (int d = 0; d < 2; ++d) {
        cudaSetDevice(d);
        Gpu& me = g[d];
        const cuda::PieceTable* t = mode == 0 || mode == 4 ? &me.local
                                    : mode == 1            ? &me.peer
                                    : mode == 2            ? &me.both
                                                           : nullptr;
        if (t != nullptr && !me.kernels->Launch(*t, me.stream).ok()) return -1;
        if (mode >= 3) {
          cudaMemcpy2DAsync(g[1 - d].incoming, kCols * 2, static_cast<char*>(me.rows) + kCols * 2,
                            kCols * 4, kCols * 2, kRows, cudaMemcpyDeviceToDevice, me.copy_stream);
        }
      }
      for (int d = 0; d < 2; ++d) {
        cudaSetDevice(d);
        cudaStreamSynchronize(g[d].stream);
        cudaStreamSynchronize(g[d].copy_stream);
      }
      if (it >= 2) times.push_back(Now() - t0);
    }
    return Median(times);
  };
  const char* names[] = {"local_kernel", "peer_kernel", "both_one_launch", "peer_copy_engine",
                         "local_kernel_plus_peer_copy_engine"};
  for (int mode = 0; mode < 5; ++mode) {
    const double s = run(mode);
    if (s < 0) return 5;
    Result(absl::StrFormat(
        R"({"bench":"p2p_overlap","case":"%s","local_bytes":%d,"peer_bytes":%d,"median_s":%.6f,"iters":%d})",
        names[mode], mode == 1 || mode == 3 ? 0 : kLocalBytes, mode == 0 ? 0 : kRows * kCols * 2, s,
        iters));
  }
  CK(cudaGetLastError());
  return 0;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  int iters = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  return wsync::bench::Main(iters);
}
