// How fast could a colocated sync be if the sender wrote straight into the
// receiver's memory over NVLink (peer access)? One process, two GPUs, the
// Llama-3-8B colocated sizes per GPU: a 6.82 GB local copy plus a
// row-parallel quarter (1.21 GB, strided rows of the trainer's shard) into
// the other GPU. Both GPUs do both parts at once, as in the real sync.
//
//   wsync_bench_p2p_overlap [--iters 5]
//
// Each case names how the local part and the peer part are moved:
//   local: wsync's batched kernel at k blocks/SM (kernelK; its table uploaded
//     each launch), a copy-only configuration of it on a table uploaded
//     once (v_*, copy_variants.h), cudaMemcpyAsync
//     (memcpy), or a plain grid-stride copy kernel with G blocks (simpleG);
//   peer: cudaMemcpy2DAsync pushed by the sender (ce_push) or pulled by the
//     receiver (ce_pull), or wsync's kernel (kernel8).
// RESULT lines give the wall time and, on GPU 0, when each part ended.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/bench_util.h"
#include "bench/gpu/copy_variants.h"
#include "common/logging.h"
#include "worker/backends/cuda/batched_kernels.h"
#include "worker/backends/cuda/piece_table.h"

namespace wsync::bench {
namespace {

constexpr int64_t kLocalBytes = 6822301696;
// down_proj-like rows: each GPU's row shard is [rows, 2 * kCols]; the peer
// takes the second half of every row.
constexpr int64_t kCols = 7168;
constexpr int64_t kRows = 1208225792 / (kCols * 2);
constexpr int64_t kPiece = int64_t{64} << 20;
constexpr int64_t kRow2D = 14336;

// kMemcpyPieces: 64 MiB cudaMemcpyAsync calls; kMemcpy2D: rows of 14 KiB
// out of 28 KiB source rows; kBatch / kBatchCe: cudaMemcpyBatchAsync of
// 64 MiB pieces, without / with cudaMemcpyFlagPreferOverlapWithCompute.
// kVariant: CopyVariants()[local_param] on the local table.
enum class Local {
  kNone,
  kKernel,
  kMemcpy,
  kSimple,
  kMemcpyPieces,
  kMemcpy2D,
  kBatch,
  kBatchCe,
  kVariant
};
// kCeLlama: Llama-3-8B's own peer writes, 32 o_proj-like (2048 rows of
// 4 KiB out of 8 KiB) and 32 down_proj-like (2048 rows of 14 KiB out of
// 28 KiB) cudaMemcpy2DAsync calls, spread over `peer_streams` streams.
enum class Peer { kNone, kCePush, kCePull, kKernel, kCeLlama };

struct Case {
  std::string name;
  Local local;
  int local_param;  // blocks/SM (kKernel) or grid (kSimple)
  Peer peer;
  bool peer_first;  // enqueue the peer part before the local one
  int peer_streams = 1;
};

struct Gpu {
  void* local_src = nullptr;
  void* local_dst = nullptr;
  void* wide_src = nullptr;  // 2 x kLocalBytes, for kMemcpy2D
  void* rows = nullptr;      // [kRows, 2 * kCols] bf16
  void* incoming = nullptr;  // [kRows, kCols] bf16, written by the peer
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;
  cudaStream_t extra_streams[3] = {};  // kCeLlama's streams 2-4
  cudaEvent_t extra_done[3] = {};
  cudaEvent_t start = nullptr, local_done = nullptr, peer_done = nullptr;
  std::map<int, std::unique_ptr<cuda::BatchedKernels>> kernels;  // by blocks/SM
  cuda::PieceTable local, peer;
  void* local_table = nullptr;  // `local`, serialized for the copy variants
  cuda::TableLayout local_layout;
};

int Main(int iters) {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    spdlog::error("needs 2 GPUs, sees {}", n);
    return 2;
  }
  Gpu g[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    int ok = 0;
    CK(cudaDeviceCanAccessPeer(&ok, d, 1 - d));
    if (!ok) {
      spdlog::error("GPU {} cannot access GPU {}", d, 1 - d);
      return 2;
    }
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&g[d].local_src, kLocalBytes));
    CK(cudaMalloc(&g[d].local_dst, kLocalBytes));
    CK(cudaMalloc(&g[d].rows, kRows * kCols * 2 * 2));
    CK(cudaMalloc(&g[d].incoming, kRows * kCols * 2));
    CK(cudaMalloc(&g[d].wide_src, 2 * kLocalBytes));
    CK(cudaMemset(g[d].local_src, 1, kLocalBytes));
    CK(cudaMemset(g[d].rows, 2, kRows * kCols * 2 * 2));
    CK(cudaStreamCreateWithFlags(&g[d].stream, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g[d].copy_stream, cudaStreamNonBlocking));
    for (int k = 0; k < 3; ++k) {
      CK(cudaStreamCreateWithFlags(&g[d].extra_streams[k], cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&g[d].extra_done[k], cudaEventDisableTiming));
    }
    CK(cudaEventCreate(&g[d].start));
    CK(cudaEventCreate(&g[d].local_done));
    CK(cudaEventCreate(&g[d].peer_done));
    for (int k : {1, 2, 4, 7, 8}) {
      auto kernels = cuda::BatchedKernels::Create(d, k);
      if (!kernels.ok()) return 4;
      g[d].kernels[k] = std::move(*kernels);
    }
  }
  const int64_t flat[] = {1};
  const int64_t local_shape[] = {kLocalBytes / 2};
  const int64_t rows_shape[] = {kRows, kCols};
  const int64_t rows_src[] = {2 * kCols, 1};
  const int64_t rows_dst[] = {kCols, 1};
  for (int d = 0; d < 2; ++d) {
    Gpu& me = g[d];
    char* second_half = static_cast<char*>(me.rows) + kCols * 2;
    if (!me.local
             .AddCopy({me.local_src, v1::BF16, flat}, {me.local_dst, v1::BF16, flat}, local_shape,
                      1, "local")
             .ok() ||
        !me.peer
             .AddCopy({second_half, v1::BF16, rows_src}, {g[1 - d].incoming, v1::BF16, rows_dst},
                      rows_shape, 2, "peer")
             .ok()) {
      return 4;
    }
  }
  for (int d = 0; d < 2; ++d) {
    Gpu& me = g[d];
    CK(cudaSetDevice(d));
    me.local_layout = cuda::TableLayout::Of(me.local);
    const cuda::TableLayout& l = me.local_layout;
    std::vector<char> h(l.total, 0);
    std::memcpy(h.data() + l.pieces_offset, me.local.pieces().data(),
                me.local.pieces().size() * sizeof(cuda::PieceDesc));
    std::memcpy(h.data() + l.tasks_offset, me.local.tasks().data(),
                me.local.tasks().size() * sizeof(cuda::TaskDesc));
    CK(cudaMalloc(&me.local_table, l.total));
    CK(cudaMemcpy(me.local_table, h.data(), l.total, cudaMemcpyHostToDevice));
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto enqueue_local = [&](int d, const Case& c) -> int {
    Gpu& me = g[d];
    switch (c.local) {
      case Local::kNone:
        return 0;
      case Local::kKernel:
        return me.kernels.at(c.local_param)->Launch(me.local, me.stream).ok() ? 0 : 4;
      case Local::kMemcpy:
        CK(cudaMemcpyAsync(me.local_dst, me.local_src, kLocalBytes, cudaMemcpyDeviceToDevice,
                           me.stream));
        return 0;
      case Local::kMemcpyPieces:
        for (int64_t off = 0; off < kLocalBytes; off += kPiece) {
          CK(cudaMemcpyAsync(
              static_cast<char*>(me.local_dst) + off, static_cast<char*>(me.local_src) + off,
              std::min(kPiece, kLocalBytes - off), cudaMemcpyDeviceToDevice, me.stream));
        }
        return 0;
      case Local::kMemcpy2D:
        CK(cudaMemcpy2DAsync(me.local_dst, kRow2D, me.wide_src, 2 * kRow2D, kRow2D,
                             kLocalBytes / kRow2D, cudaMemcpyDeviceToDevice, me.stream));
        return 0;
      case Local::kBatch:
      case Local::kBatchCe: {
        std::vector<void*> dsts;
        std::vector<const void*> srcs;
        std::vector<size_t> sizes;
        for (int64_t off = 0; off < kLocalBytes; off += kPiece) {
          dsts.push_back(static_cast<char*>(me.local_dst) + off);
          srcs.push_back(static_cast<char*>(me.local_src) + off);
          sizes.push_back(std::min(kPiece, kLocalBytes - off));
        }
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = c.local == Local::kBatchCe ? cudaMemcpyFlagPreferOverlapWithCompute : 0;
        size_t idx = 0;
        CK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &idx, 1,
                                me.stream));
        return 0;
      }
      case Local::kSimple:
        CK(CopySimple(me.local_dst, me.local_src, kLocalBytes, c.local_param, me.stream));
        return 0;
      case Local::kVariant:
        CK(CopyVariants()[c.local_param].run(me.local_table, me.local_layout, 8, sms, me.stream));
        return 0;
    }
    return 0;
  };
  auto enqueue_peer = [&](int d, const Case& c) -> int {
    Gpu& me = g[d];
    Gpu& other = g[1 - d];
    switch (c.peer) {
      case Peer::kNone:
        return 0;
      case Peer::kCePush:
        CK(cudaMemcpy2DAsync(other.incoming, kCols * 2, static_cast<char*>(me.rows) + kCols * 2,
                             kCols * 4, kCols * 2, kRows, cudaMemcpyDeviceToDevice,
                             me.copy_stream));
        return 0;
      case Peer::kCePull:
        CK(cudaMemcpy2DAsync(me.incoming, kCols * 2, static_cast<char*>(other.rows) + kCols * 2,
                             kCols * 4, kCols * 2, kRows, cudaMemcpyDeviceToDevice,
                             me.copy_stream));
        return 0;
      case Peer::kKernel:
        return me.kernels.at(8)->Launch(me.peer, me.copy_stream).ok() ? 0 : 4;

      case Peer::kCeLlama: {
        const char* src = static_cast<const char*>(me.rows);
        char* dst = static_cast<char*>(other.incoming);
        for (int i = 0; i < 64; ++i) {
          const int64_t row = i < 32 ? 4096 : 14336;  // bytes written per row
          cudaStream_t s =
              i % c.peer_streams == 0 ? me.copy_stream : me.extra_streams[i % c.peer_streams - 1];
          if (i % c.peer_streams != 0) cudaStreamWaitEvent(s, me.start, 0);
          CK(cudaMemcpy2DAsync(dst, row, src + row, 2 * row, row, 2048, cudaMemcpyDeviceToDevice,
                               s));
          src += 2 * row * 2048;
          dst += row * 2048;
        }
        for (int k = 0; k + 1 < c.peer_streams; ++k) {
          CK(cudaEventRecord(me.extra_done[k], me.extra_streams[k]));
          CK(cudaStreamWaitEvent(me.copy_stream, me.extra_done[k], 0));
        }
        return 0;
      }
    }
    return 0;
  };
  auto run = [&](const Case& c, double* local_ms, double* peer_ms) -> double {
    std::vector<double> times, locals, peers;
    for (int it = 0; it < iters + 2; ++it) {
      const double t0 = Now();
      for (int d = 0; d < 2; ++d) {
        cudaSetDevice(d);
        Gpu& me = g[d];
        cudaEventRecord(me.start, me.stream);
        cudaStreamWaitEvent(me.copy_stream, me.start, 0);
        int rc = c.peer_first ? enqueue_peer(d, c) : enqueue_local(d, c);
        if (rc == 0) rc = c.peer_first ? enqueue_local(d, c) : enqueue_peer(d, c);
        if (rc != 0) return -1;
        cudaEventRecord(me.local_done, me.stream);
        cudaEventRecord(me.peer_done, me.copy_stream);
      }
      for (int d = 0; d < 2; ++d) {
        cudaSetDevice(d);
        cudaStreamSynchronize(g[d].stream);
        cudaStreamSynchronize(g[d].copy_stream);
      }
      if (it < 2) continue;
      times.push_back(Now() - t0);
      float l = 0, p = 0;
      cudaEventElapsedTime(&l, g[0].start, g[0].local_done);
      cudaEventElapsedTime(&p, g[0].start, g[0].peer_done);
      locals.push_back(l);
      peers.push_back(p);
    }
    *local_ms = Median(locals);
    *peer_ms = Median(peers);
    return Median(times);
  };
  std::vector<Case> cases = {
      {"local_kernel8", Local::kKernel, 8, Peer::kNone, false},
      {"local_memcpy", Local::kMemcpy, 0, Peer::kNone, false},
      {"peer_ce_push", Local::kNone, 0, Peer::kCePush, false},
      {"peer_ce_pull", Local::kNone, 0, Peer::kCePull, false},
      {"peer_kernel8", Local::kNone, 0, Peer::kKernel, false},
      {"kernel8+ce_push", Local::kKernel, 8, Peer::kCePush, false},
      {"kernel7+ce_push", Local::kKernel, 7, Peer::kCePush, false},
      {"kernel4+ce_push", Local::kKernel, 4, Peer::kCePush, false},
      {"kernel2+ce_push", Local::kKernel, 2, Peer::kCePush, false},
      {"kernel1+ce_push", Local::kKernel, 1, Peer::kCePush, false},
      {"kernel8+ce_push peer first", Local::kKernel, 8, Peer::kCePush, true},
      {"kernel8+ce_pull", Local::kKernel, 8, Peer::kCePull, false},
      {"memcpy+ce_push", Local::kMemcpy, 0, Peer::kCePush, false},
      {"memcpy+ce_pull", Local::kMemcpy, 0, Peer::kCePull, false},
      {"memcpy+ce_push peer first", Local::kMemcpy, 0, Peer::kCePush, true},
      {"local_memcpy_pieces", Local::kMemcpyPieces, 0, Peer::kNone, false},
      {"local_memcpy2d", Local::kMemcpy2D, 0, Peer::kNone, false},
      {"local_batch", Local::kBatch, 0, Peer::kNone, false},
      {"local_batch_ce", Local::kBatchCe, 0, Peer::kNone, false},
      {"memcpy_pieces+ce_push", Local::kMemcpyPieces, 0, Peer::kCePush, false},
      {"memcpy2d+ce_push", Local::kMemcpy2D, 0, Peer::kCePush, false},
      {"batch+ce_push", Local::kBatch, 0, Peer::kCePush, false},
      {"batch_ce+ce_push", Local::kBatchCe, 0, Peer::kCePush, false},
  };
  for (size_t v = 0; v < CopyVariants().size(); ++v) {
    const std::string& n = CopyVariants()[v].name;
    const int param = static_cast<int>(v);
    cases.push_back({"local_" + n, Local::kVariant, param, Peer::kNone, false});
    cases.push_back({n + "+ce_llama1", Local::kVariant, param, Peer::kCeLlama, false, 1});
  }
  for (int mult : {1, 2, 4, 8}) {
    cases.push_back({absl::StrFormat("local_simple%d", sms * mult), Local::kSimple, sms * mult,
                     Peer::kNone, false});
  }
  for (int grid : {sms / 4, sms / 2, (3 * sms) / 4, sms, 2 * sms, 4 * sms}) {
    cases.push_back(
        {absl::StrFormat("simple%d+ce_push", grid), Local::kSimple, grid, Peer::kCePush, false});
  }
  for (int streams : {1, 4}) {
    const std::string n = absl::StrFormat("ce_llama%d", streams);
    cases.push_back({"peer_" + n, Local::kNone, 0, Peer::kCeLlama, false, streams});
    cases.push_back({"kernel7+" + n, Local::kKernel, 7, Peer::kCeLlama, false, streams});
    cases.push_back({"kernel2+" + n, Local::kKernel, 2, Peer::kCeLlama, false, streams});
    cases.push_back({"memcpy+" + n, Local::kMemcpy, 0, Peer::kCeLlama, false, streams});
    cases.push_back({absl::StrFormat("simple%d+", 2 * sms) + n, Local::kSimple, 2 * sms,
                     Peer::kCeLlama, false, streams});
  }
  for (const Case& c : cases) {
    double local_ms = 0, peer_ms = 0;
    const double s = run(c, &local_ms, &peer_ms);
    if (s < 0) return 5;
    Result(absl::StrFormat(
        R"({"bench":"p2p_overlap","case":"%s","local_bytes":%d,"peer_bytes":%d,"median_s":%.6f,"gpu0_local_end_ms":%.3f,"gpu0_peer_end_ms":%.3f,"iters":%d})",
        c.name, c.local == Local::kNone ? 0 : kLocalBytes,
        c.peer == Peer::kNone ? 0 : kRows * kCols * 2, s, local_ms, peer_ms, iters));
  }
  CK(cudaGetLastError());
  return 0;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  wsync::InitLogging("wsync_bench_p2p_overlap");
  int iters = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  return wsync::bench::Main(iters);
}
