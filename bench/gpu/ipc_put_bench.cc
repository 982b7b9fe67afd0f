// The colocated sync's direct writes, replicated in two processes (one per
// GPU, as wsync runs), against the one-process replica in p2p_overlap.cc:
// each process exports its destination and its source rows by CUDA IPC,
// opens the other's, then both at once move Llama-3-8B's 64 row-parallel
// pieces (32 of 2048 rows x 4 KiB, 32 of 2048 rows x 14 KiB, each out of rows
// twice as long) -- packed together, or spread over GBs as in real slabs --
// alone or beside the 6.82 GB local copy (wsync's copy-only
// kernel at 3 blocks/SM, or one cudaMemcpyAsync):
//   push_ce      the writer's copy engines, cudaMemcpy2DAsync into the peer
//   pull_ce      the reader's copy engines, from the peer's rows into its own
//   push_kernel  wsync's piece kernel writing the peer (1 or 8 blocks/SM)
//
//   wsync_bench_ipc_put [--iters 7] [--nccl-first 0]
// (--nccl-first 1: wsync's NCCL transport is set up first, as in a worker,
// and every barrier goes through it.)
#include <cuda_runtime_api.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/bench_util.h"
#include "worker/backends/cuda/batched_kernels.h"
#include "worker/backends/cuda/nccl_transport.h"
#include "worker/backends/cuda/piece_table.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {
namespace {

constexpr int kPuts = 64;
constexpr int64_t kRows = 2048;
constexpr int64_t kLocalBytes = 6822301696;
constexpr int64_t kSpread = int64_t{128} << 20;
const char* const kPassNames[] = {"",
                                  " spread",
                                  " spread_4streams",
                                  " random_data",
                                  " wsync_nccl_transport",
                                  " spread_dst_8k_aligned"};
int64_t RowBytes(int i) { return i < 32 ? 4096 : 14336; }
int64_t PutBytes(int i) { return RowBytes(i) * kRows; }
int64_t TotalBytes() {
  int64_t t = 0;
  for (int i = 0; i < kPuts; ++i) t += PutBytes(i);
  return t;
}
int64_t Offset(int i) {
  int64_t t = 0;
  for (int k = 0; k < i; ++k) t += PutBytes(k);
  return t;
}

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool Barrier(int fd) {
  char b = 1;
  return WriteAll(fd, &b, 1) && ReadAll(fd, &b, 1);
}

enum class Peer { kNone, kPushCe, kPullCe, kPushKernel1, kPushKernel8 };
enum class Local { kNone, kKernel, kMemcpy };

struct Case {
  const char* name;
  Peer peer;
  Local local;
};

std::unique_ptr<transport::NcclTransport> MakeTransport(int rank, const std::string& store_dir) {
  transport::FileKvStore store(store_dir);
  transport::NcclTransportOptions o;
  o.device = rank;
  o.rank = rank;
  o.size = 2;
  auto t = transport::NcclTransport::Create(store, "ipc_put", o);
  if (!t.ok()) return nullptr;
  return std::move(*t);
}

// nccl_first: set wsync's NCCL transport up before anything else, as a
// worker does (the CUDA IPC mappings come after it); otherwise in pass 4.
int Rank(int rank, int fd, int iters, const std::string& store_dir, bool nccl_first) {
  CK(cudaSetDevice(rank));
  std::unique_ptr<transport::NcclTransport> nccl;
  char* token = nullptr;
  if (nccl_first) {
    nccl = MakeTransport(rank, store_dir);
    if (nccl == nullptr) return 4;
    CK(cudaMalloc(&token, 2));
  }
  void* rows = nullptr;  // [i]: kRows rows of 2 * RowBytes(i); the peer gets each second half
  void* dst = nullptr;   // what the peer writes (push) or this rank reads into (pull)
  void* local_src = nullptr;
  void* local_dst = nullptr;
  CK(cudaMalloc(&rows, 2 * TotalBytes()));
  CK(cudaMalloc(&dst, TotalBytes()));
  CK(cudaMalloc(&local_src, kLocalBytes));
  CK(cudaMalloc(&local_dst, kLocalBytes));
  CK(cudaMemset(rows, 3, 2 * TotalBytes()));
  CK(cudaMemset(local_src, 1, kLocalBytes));
  // The spread layout: put i's rows and destination kSpread apart, as in the
  // real slabs (several GB), instead of packed together.
  void* spread_rows = nullptr;
  void* spread_dst = nullptr;
  CK(cudaMalloc(&spread_rows, kPuts * kSpread));
  CK(cudaMalloc(&spread_dst, kPuts * kSpread));
  CK(cudaMemset(spread_rows, 3, kPuts * kSpread));
  cudaIpcMemHandle_t mine[3], theirs[3];
  CK(cudaIpcGetMemHandle(&mine[0], rows));
  CK(cudaIpcGetMemHandle(&mine[1], dst));
  CK(cudaIpcGetMemHandle(&mine[2], spread_dst));
  if (!WriteAll(fd, mine, sizeof(mine)) || !ReadAll(fd, theirs, sizeof(theirs))) return 4;
  void* peer_rows = nullptr;
  void* peer_dst = nullptr;
  CK(cudaIpcOpenMemHandle(&peer_rows, theirs[0], cudaIpcMemLazyEnablePeerAccess));
  CK(cudaIpcOpenMemHandle(&peer_dst, theirs[1], cudaIpcMemLazyEnablePeerAccess));
  void* peer_spread_dst = nullptr;
  CK(cudaIpcOpenMemHandle(&peer_spread_dst, theirs[2], cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t local_stream, peer_stream;
  CK(cudaStreamCreateWithFlags(&local_stream, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&peer_stream, cudaStreamNonBlocking));
  cudaStream_t more_streams[3];
  cudaEvent_t start_ev, more_done[3];
  CK(cudaEventCreateWithFlags(&start_ev, cudaEventDisableTiming));
  for (int k = 0; k < 3; ++k) {
    CK(cudaStreamCreateWithFlags(&more_streams[k], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&more_done[k], cudaEventDisableTiming));
  }
  auto local_kernels = cuda::BatchedKernels::Create(rank, 8);
  auto put1 = cuda::BatchedKernels::Create(rank, 1);
  auto put8 = cuda::BatchedKernels::Create(rank, 8);
  if (!local_kernels.ok() || !put1.ok() || !put8.ok()) return 4;
  cuda::PieceTable local_table, put_table;
  const int64_t flat[] = {1};
  const int64_t local_shape[] = {kLocalBytes / 2};
  if (!local_table
           .AddCopy({local_src, v1::BF16, flat}, {local_dst, v1::BF16, flat}, local_shape, 1, "l")
           .ok()) {
    return 4;
  }
  for (int i = 0; i < kPuts; ++i) {
    const int64_t shape[] = {kRows, RowBytes(i) / 2};
    const int64_t ss[] = {RowBytes(i), 1};
    const int64_t ds[] = {RowBytes(i) / 2, 1};
    char* src = static_cast<char*>(rows) + 2 * Offset(i) + RowBytes(i);
    if (!put_table
             .AddCopy({src, v1::BF16, ss}, {static_cast<char*>(peer_dst) + Offset(i), v1::BF16, ds},
                      shape, 2, "p")
             .ok()) {
      return 4;
    }
  }
  cuda::DeviceBuffer local_resident, put_resident1, put_resident8;
  CK(cudaDeviceSynchronize());
  // Then the same with an NCCL communicator of both processes set up and
  // connected (as in a wsync worker), to see whether its presence matters.
  const Case cases[] = {
      {"local_kernel", Peer::kNone, Local::kKernel},
      {"local_memcpy", Peer::kNone, Local::kMemcpy},
      {"push_ce", Peer::kPushCe, Local::kNone},
      {"pull_ce", Peer::kPullCe, Local::kNone},
      {"push_kernel8", Peer::kPushKernel8, Local::kNone},
      {"push_ce+local_kernel", Peer::kPushCe, Local::kKernel},
      {"pull_ce+local_kernel", Peer::kPullCe, Local::kKernel},
      {"push_kernel1+local_kernel", Peer::kPushKernel1, Local::kKernel},
      {"push_ce+local_memcpy", Peer::kPushCe, Local::kMemcpy},
      {"pull_ce+local_memcpy", Peer::kPullCe, Local::kMemcpy},
  };
  bool first_local = true, first_put1 = true, first_put8 = true;
  // Pass 0: packed layout, one stream. Pass 1: spread layout. Pass 2:
  // spread, o_proj-like and down_proj-like puts interleaved over 4 streams
  // (as wsync issues them).
  // Pass 3: pass 0 again, with every source filled with random bits
  // instead of a constant byte.
  // Pass 4: pass 3 with wsync's NCCL transport set up as a worker has it
  // (nonblocking communicator, 64 p2p channels), barriers through it.
  // Pass 5: spread, each destination only 8 KiB aligned (as vLLM-like
  // tensors carved from a slab can be).
  for (int pass = 0; pass < 6; ++pass) {
    if (pass == 4 && nccl == nullptr) {
      nccl = MakeTransport(rank, store_dir);
      if (nccl == nullptr) return 4;
      CK(cudaMalloc(&token, 2));
    }
    if (pass == 3) {
      CK(Fill16Strided(rows, 1, TotalBytes(), TotalBytes(), 11 + rank, local_stream));
      CK(Fill16Strided(local_src, 1, kLocalBytes / 2, kLocalBytes / 2, 21 + rank, local_stream));
      CK(cudaStreamSynchronize(local_stream));
    }
    for (const Case& c : cases) {
      if (pass != 0 && pass != 3 && c.peer != Peer::kPushCe) continue;
      std::vector<double> times;
      for (int it = 0; it < iters + 2; ++it) {
        if (!Barrier(fd)) return 4;
        if (nccl != nullptr) {
          const std::vector<transport::SendRequest> sends = {{1 - rank, 7, token, 1}};
          const std::vector<transport::RecvRequest> recvs = {{1 - rank, 7, token + 1, 1}};
          if (!nccl->RunRound(sends, recvs, absl::Now() + absl::Seconds(60)).ok()) return 4;
        }
        const double t0 = Now();
        switch (c.peer) {
          case Peer::kNone:
            break;
          case Peer::kPushCe:
          case Peer::kPullCe:
            if (pass == 2) {
              CK(cudaEventRecord(start_ev, peer_stream));
              for (int k = 0; k < 3; ++k) CK(cudaStreamWaitEvent(more_streams[k], start_ev, 0));
            }
            for (int j = 0; j < kPuts; ++j) {
              // Pass 2 alternates the two row widths.
              const int i = pass == 2 ? (j % 2 ? j / 2 : 32 + j / 2) : j;
              const int64_t w = RowBytes(i);
              const bool push = c.peer == Peer::kPushCe;
              const bool spread = pass == 1 || pass == 2 || pass == 5;
              const char* src =
                  spread ? static_cast<const char*>(spread_rows) + i * kSpread + w
                         : static_cast<const char*>(push ? rows : peer_rows) + 2 * Offset(i) + w;
              char* to = spread ? static_cast<char*>(peer_spread_dst) + i * kSpread +
                                      (pass == 5 ? 0x7a000 : 0)
                                : static_cast<char*>(push ? peer_dst : dst) + Offset(i);
              cudaStream_t st = pass == 2 && j % 4 != 0 ? more_streams[j % 4 - 1] : peer_stream;
              CK(cudaMemcpy2DAsync(to, w, src, 2 * w, w, kRows, cudaMemcpyDefault, st));
            }
            if (pass == 2) {
              for (int k = 0; k < 3; ++k) {
                CK(cudaEventRecord(more_done[k], more_streams[k]));
                CK(cudaStreamWaitEvent(peer_stream, more_done[k], 0));
              }
            }
            break;
          case Peer::kPushKernel1:
          case Peer::kPushKernel8: {
            const bool one = c.peer == Peer::kPushKernel1;
            auto& k = one ? *put1 : *put8;
            auto& res = one ? put_resident1 : put_resident8;
            bool& first = one ? first_put1 : first_put8;
            auto s = first ? k->Launch(put_table, peer_stream, &res)
                           : k->LaunchResident(res.data(), cuda::TableLayout::Of(put_table),
                                               peer_stream);
            first = false;
            if (!s.ok()) return 4;
            break;
          }
        }
        switch (c.local) {
          case Local::kNone:
            break;
          case Local::kKernel: {
            auto s = first_local
                         ? (*local_kernels)->Launch(local_table, local_stream, &local_resident)
                         : (*local_kernels)
                               ->LaunchResident(local_resident.data(),
                                                cuda::TableLayout::Of(local_table), local_stream);
            first_local = false;
            if (!s.ok()) return 4;
            break;
          }
          case Local::kMemcpy:
            CK(cudaMemcpyAsync(local_dst, local_src, kLocalBytes, cudaMemcpyDeviceToDevice,
                               local_stream));
            break;
        }
        CK(cudaStreamSynchronize(peer_stream));
        CK(cudaStreamSynchronize(local_stream));
        if (it >= 2) times.push_back(Now() - t0);
      }
      if (rank == 0) {
        Result(absl::StrFormat(
            R"({"bench":"ipc_put","processes":2,"case":"%s%s","peer_bytes":%d,"local_bytes":%d,"median_s":%.6f,"iters":%d})",
            c.name, kPassNames[pass], c.peer == Peer::kNone ? 0 : TotalBytes(),
            c.local == Local::kNone ? 0 : kLocalBytes, Median(times), iters));
      }
    }
  }
  if (!Barrier(fd)) return 4;
  return 0;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  wsync::InitLogging("wsync_bench_ipc_put");
  int iters = 7;
  bool nccl_first = false;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--nccl-first") == 0) nccl_first = std::atoi(argv[i + 1]) != 0;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 2;
  // No CUDA call before the fork: each process gets its own driver state.
  const std::string dir = wsync::bench::MakeStoreDir("ipc_put");
  const pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) _exit(wsync::bench::Rank(1, sv[1], iters, dir, nccl_first));
  const int rc = wsync::bench::Rank(0, sv[0], iters, dir, nccl_first);
  close(sv[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
}
