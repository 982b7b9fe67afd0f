// The ceiling every GPU number is measured against: raw NCCL send/recv between
// two GPUs, one process each (blocking communicator, no wsync code on the
// data path). Also: both directions at once, many pieces in one group (what a
// plan of small zero-copy buckets would cost), and device-to-device copy
// bandwidth (cudaMemcpyAsync and wsync's batched kernel) for local-copy bounds.
//
// With --gpus 4 (or more) the two-GPU cases run on GPUs 0-1 and the
// multi-GPU patterns of the 4-GPU benchmark follow: two pairs at once (0->2,
// 1->3), two senders into one GPU (0->2, 1->2), one GPU into two (0->2,
// 0->3), and every GPU to every other; each reports the rate through its
// busiest GPU (max of its bytes in and out / time).
//
//   wsync_bench_nccl_ceiling [--iters N] [--gpus 2]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "bench/gpu/bench_util.h"
#include "common/logging.h"
#include "worker/backends/cuda/batched_kernels.h"
#include "worker/backends/cuda/nccl_transport.h"
#include "worker/backends/cuda/piece_table.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {
namespace {

int iters = 20;
int world = 2;

struct Flow {
  int from, to;
  size_t bytes;
};

int RankMain(int rank, const std::string& dir) {
  CK(cudaSetDevice(rank));
  transport::FileKvStore store(dir);
  ncclUniqueId id;
  if (rank == 0) {
    CK(ncclGetUniqueId(&id));
    if (!store.Set("id", transport::UniqueIdToBytes(id)).ok()) return 4;
  } else {
    auto b = store.Get("id", absl::Now() + absl::Seconds(60));
    if (!b.ok()) return 4;
    std::memcpy(&id, b->data(), sizeof(id));
  }
  const double t_init = Now();
  ncclComm_t comm;
  CK(ncclCommInitRank(&comm, world, id, rank));
  const double init_s = Now() - t_init;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t max_bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, max_bytes));
  CK(cudaMalloc(&b, max_bytes));
  CK(cudaMemset(a, rank + 1, max_bytes));
  CK(cudaDeviceSynchronize());
  const int peer = rank < 2 ? 1 - rank : -1;  // the two-GPU cases use GPUs 0-1

  // pieces == 1: one send of `bytes`; else `bytes` cut into equal pieces,
  // all in one group. both: each rank sends and receives.
  auto run = [&](size_t bytes, size_t pieces, bool both, const char* name) -> int {
    if (peer < 0) return 0;
    const size_t piece = bytes / pieces;
    std::vector<double> times;
    for (int it = 0; it < iters + 3; ++it) {
      const double t0 = Now();
      CK(ncclGroupStart());
      for (size_t p = 0; p < pieces; ++p) {
        char* off_a = static_cast<char*>(a) + p * piece;
        char* off_b = static_cast<char*>(b) + p * piece;
        if (rank == 0 || both) CK(ncclSend(off_a, piece, ncclUint8, peer, comm, stream));
        if (rank == 1 || both) CK(ncclRecv(off_b, piece, ncclUint8, peer, comm, stream));
      }
      CK(ncclGroupEnd());
      CK(cudaStreamSynchronize(stream));
      if (it >= 3) times.push_back(Now() - t0);
    }
    const double med = Median(times);
    if (rank == 1) {
      Result(absl::StrFormat(
          R"({"bench":"nccl_ceiling","case":"%s","bytes":%d,"pieces":%d,"both_directions":%s,"median_s":%.6f,"min_s":%.6f,"gbps":%.1f,"iters":%d})",
          name, bytes, pieces, both ? "true" : "false", med,
          *std::min_element(times.begin(), times.end()), piece * pieces / med / 1e9, iters));
    }
    return 0;
  };
  int rc = 0;
  rc |= run(size_t{1} << 30, 1, false, "sendrecv_1GiB");
  rc |= run(size_t{256} << 20, 1, false, "sendrecv_256MiB");
  rc |= run(size_t{16} << 20, 1, false, "sendrecv_16MiB");
  rc |= run(size_t{2} << 30, 1, false, "sendrecv_2GiB");
  rc |= run(size_t{1} << 30, 1, true, "bidirectional_1GiB");
  rc |= run(size_t{3} << 29, 512, false, "group_512x3MiB");
  rc |= run(size_t{1} << 30, 64, false, "group_64x16MiB");
  rc |= run(size_t{1} << 30, 4, false, "group_4x256MiB");
  rc |= run(size_t{2} << 30, 32, false, "group_32x64MiB");

  // Multi-GPU patterns: all ranks take part in every iteration (a one-element
  // all-reduce lines them up), each posting its flows in one group.
  void* sync_buf = nullptr;
  CK(cudaMalloc(&sync_buf, 4));
  auto pattern = [&](const std::vector<Flow>& flows, const char* name) -> int {
    std::vector<size_t> in(world, 0), out(world, 0);
    for (const Flow& f : flows) {
      out[f.from] += f.bytes;
      in[f.to] += f.bytes;
    }
    int busiest = 0;
    for (int r = 0; r < world; ++r) {
      if (std::max(in[r], out[r]) > std::max(in[busiest], out[busiest])) busiest = r;
    }
    std::vector<double> times;
    for (int it = 0; it < iters + 3; ++it) {
      CK(ncclAllReduce(sync_buf, sync_buf, 1, ncclFloat, ncclSum, comm, stream));
      CK(cudaStreamSynchronize(stream));
      const double t0 = Now();
      CK(ncclGroupStart());
      size_t off_out = 0, off_in = 0;
      for (const Flow& f : flows) {
        if (f.from == rank) {
          CK(ncclSend(static_cast<char*>(a) + off_out, f.bytes, ncclUint8, f.to, comm, stream));
          off_out += f.bytes;
        }
        if (f.to == rank) {
          CK(ncclRecv(static_cast<char*>(b) + off_in, f.bytes, ncclUint8, f.from, comm, stream));
          off_in += f.bytes;
        }
      }
      CK(ncclGroupEnd());
      CK(cudaStreamSynchronize(stream));
      if (it >= 3) times.push_back(Now() - t0);
    }
    if (rank == busiest) {
      const double med = Median(times);
      Result(absl::StrFormat(
          R"({"bench":"nccl_ceiling","case":"%s","gpus":%d,"busiest_gpu":%d,"busiest_bytes_in":%d,"busiest_bytes_out":%d,"median_s":%.6f,"gbps":%.1f,"iters":%d})",
          name, world, busiest, in[busiest], out[busiest], med,
          std::max(in[busiest], out[busiest]) / med / 1e9, iters));
    }
    return 0;
  };
  if (world >= 4) {
    const size_t g = size_t{1} << 30;
    rc |= pattern({{0, 2, g}, {1, 3, g}}, "pairs_0to2_1to3_1GiB");
    rc |= pattern({{0, 2, g}, {1, 2, g}}, "fanin_0to2_1to2_1GiB");
    rc |= pattern({{0, 2, g}, {0, 3, g}}, "fanout_0to2_0to3_1GiB");
    rc |= pattern({{0, 2, g}, {0, 3, g}, {1, 2, g}, {1, 3, g}}, "bipartite_01to23_1GiB");
    std::vector<Flow> all;
    for (int i = 0; i < world; ++i) {
      for (int j = 0; j < world; ++j) {
        if (i != j) all.push_back({i, j, g / (world - 1) / 256 * 256});
      }
    }
    rc |= pattern(all, "all_to_all_1GiB_per_gpu");
  }
  cudaFree(sync_buf);

  // Local copy bandwidth on this GPU (bytes copied / time; each byte is read
  // and written once).
  std::vector<double> t_memcpy, t_kernel;
  const size_t cb = size_t{1} << 30;
  auto kernels = cuda::BatchedKernels::Create(rank);
  if (!kernels.ok()) return 5;
  cuda::PieceTable table;
  const int64_t shape[] = {static_cast<int64_t>(cb / 2)};
  const int64_t st[] = {1};
  if (!table.AddCopy({a, v1::BF16, st}, {b, v1::BF16, st}, shape, 1, "copy").ok()) return 5;
  for (int it = 0; it < iters + 3; ++it) {
    double t0 = Now();
    CK(cudaMemcpyAsync(b, a, cb, cudaMemcpyDeviceToDevice, stream));
    CK(cudaStreamSynchronize(stream));
    if (it >= 3) t_memcpy.push_back(Now() - t0);
    t0 = Now();
    if (!(*kernels)->Launch(table, stream).ok()) return 5;
    CK(cudaStreamSynchronize(stream));
    if (it >= 3) t_kernel.push_back(Now() - t0);
  }
  Result(absl::StrFormat(
      R"({"bench":"device_copy","rank":%d,"bytes":%d,"memcpy_median_s":%.6f,"memcpy_gbps":%.1f,"kernel_median_s":%.6f,"kernel_gbps":%.1f})",
      rank, cb, Median(t_memcpy), cb / Median(t_memcpy) / 1e9, Median(t_kernel),
      cb / Median(t_kernel) / 1e9));
  // Overlap: what a round could take if the interpreter ran local copies (or
  // the next round's packing) while NCCL transfers. Sizes of the Llama-3-8B
  // colocated case per GPU (1.21 GB each way, 6.82 GB local) and of one 2 GiB
  // Qwen round (send 2 GiB while packing / unpacking 2 GiB).
  if (peer >= 0 && world == 2) {
    const size_t net = 1208225792, local = 6822301696, round = size_t{2} << 30;
    void *c = nullptr, *d = nullptr;
    CK(cudaMalloc(&c, local));
    CK(cudaMalloc(&d, local));
    CK(cudaMemset(c, 3, local));
    cudaStream_t s2;
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    auto copy_table = [&](size_t bytes) {
      cuda::PieceTable t;
      const int64_t sh[] = {static_cast<int64_t>(bytes / 2)};
      (void)t.AddCopy({c, v1::BF16, st}, {d, v1::BF16, st}, sh, 1, "overlap");
      return t;
    };
    const cuda::PieceTable t_local = copy_table(local), t_round = copy_table(round);
    // mode 0: transfer only, 1: copy only, 2: both at once; 3 / 4: copy only
    // / both at once with the copy as one cudaMemcpyAsync (copy engines, no
    // SMs taken from NCCL) instead of wsync's kernel.
    auto measure = [&](size_t net_bytes, bool both_dirs, const cuda::PieceTable& t,
                       size_t copy_bytes, int mode) -> double {
      std::vector<double> times;
      for (int it = 0; it < iters + 2; ++it) {
        const double t0 = Now();
        if (mode != 1 && mode != 3) {
          ncclGroupStart();
          if (rank == 0 || both_dirs) ncclSend(a, net_bytes, ncclUint8, peer, comm, stream);
          if (rank == 1 || both_dirs) ncclRecv(b, net_bytes, ncclUint8, peer, comm, stream);
          ncclGroupEnd();
        }
        if ((mode == 1 || mode == 2) && !(*kernels)->Launch(t, s2).ok()) return -1;
        if (mode >= 3) CK(cudaMemcpyAsync(d, c, copy_bytes, cudaMemcpyDeviceToDevice, s2));
        cudaStreamSynchronize(stream);
        cudaStreamSynchronize(s2);
        if (it >= 2) times.push_back(Now() - t0);
      }
      return Median(times);
    };
    for (int which = 0; which < 2; ++which) {
      const bool colocated = which == 0;
      const size_t nb = colocated ? net : round;
      const cuda::PieceTable& t = colocated ? t_local : t_round;
      const size_t cbytes = colocated ? local : round;
      const double tn = measure(nb, colocated, t, cbytes, 0);
      const double tc = measure(nb, colocated, t, cbytes, 1);
      const double tb = measure(nb, colocated, t, cbytes, 2);
      const double tmc = measure(nb, colocated, t, cbytes, 3);
      const double tmb = measure(nb, colocated, t, cbytes, 4);
      Result(absl::StrFormat(
          R"({"bench":"overlap","case":"%s","rank":%d,"net_bytes":%d,"copy_bytes":%d,"transfer_s":%.6f,"copy_s":%.6f,"serial_s":%.6f,"overlapped_s":%.6f,"memcpy_copy_s":%.6f,"memcpy_overlapped_s":%.6f})",
          colocated ? "colocated_llama3_8b" : "round_2GiB_pack", rank, nb, cbytes, tn, tc, tn + tc,
          tb, tmc, tmb));
    }
    cudaFree(c);
    cudaFree(d);
    cudaStreamDestroy(s2);
  }
  if (rank == 0) {
    int version = 0;
    ncclGetVersion(&version);
    Result(absl::StrFormat(
        R"({"bench":"nccl_ceiling","case":"comm_init","seconds":%.3f,"nccl_runtime_version":%d})",
        init_s, version));
  }
  ncclCommDestroy(comm);
  cudaFree(a);
  cudaFree(b);
  return rc;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  wsync::InitLogging("wsync_bench_nccl_ceiling");
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) wsync::bench::iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--gpus") == 0) wsync::bench::world = std::atoi(argv[i + 1]);
  }
  if (wsync::bench::world < 2) {
    spdlog::error("--gpus must be at least 2");
    return 2;
  }
  const std::string dir = wsync::bench::MakeStoreDir("ceiling");
  return wsync::bench::ForkRanks(wsync::bench::world,
                                 [&](int r) { return wsync::bench::RankMain(r, dir); });
}
