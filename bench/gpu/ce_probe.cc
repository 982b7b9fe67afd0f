#include "bench/gpu/ce_probe.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/bench_util.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/ipc_registry.h"

namespace wsync::bench {
namespace {

constexpr int kPieces = 64;
constexpr size_t kRows = 2048;
size_t Width(int i) { return i < 32 ? 4096 : 14336; }

std::string HexOf(const cudaIpcMemHandle_t& h) {
  std::string out;
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    absl::StrAppend(&out, absl::StrFormat("%02x", static_cast<unsigned char>(h.reserved[i])));
  }
  return out;
}

absl::StatusOr<cudaIpcMemHandle_t> HandleOf(const std::string& hex) {
  cudaIpcMemHandle_t h{};
  if (hex.size() != 2 * sizeof(h.reserved)) return absl::InvalidArgumentError("bad handle");
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    h.reserved[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return h;
}

}  // namespace

absl::StatusOr<SpinBarrier> SpinBarrier::Open(const std::string& path, int parties) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path));
  // Both may truncate: the size is the same and a new file reads as zeros.
  if (ftruncate(fd, 4096) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("ftruncate ", path));
  }
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path));
  SpinBarrier b;
  b.counter_ = static_cast<std::atomic<uint64_t>*>(p);
  b.parties_ = parties;
  return b;
}

SpinBarrier::SpinBarrier(SpinBarrier&& o) noexcept
    : counter_(o.counter_), parties_(o.parties_), rounds_(o.rounds_) {
  o.counter_ = nullptr;
}

SpinBarrier::~SpinBarrier() {
  if (counter_ != nullptr) munmap(counter_, 4096);
}

absl::Status SpinBarrier::Wait() {
  ++rounds_;
  counter_->fetch_add(1);
  const uint64_t target = rounds_ * static_cast<uint64_t>(parties_);
  const double deadline = Now() + 60;
  while (counter_->load() < target) {
    if (Now() > deadline) return absl::DeadlineExceededError("spin barrier: the peer never came");
  }
  return absl::OkStatus();
}

absl::Status RunCeProbe(const std::string& label, int worker, int iters, transport::KvStore& store,
                        const std::function<absl::Status()>& barrier, const ProbeMemory& memory) {
  size_t dst_bytes = 0;
  for (int i = 0; i < kPieces; ++i) dst_bytes += Width(i) * kRows;
  const size_t dst_alloc = (memory.destination_doubled ? 2 * dst_bytes : dst_bytes) +
                           static_cast<size_t>(memory.destination_extra_bytes);
  ASSIGN_OR_RETURN(cuda::DeviceBuffer src, cuda::DeviceBuffer::Allocate(worker, 2 * dst_bytes));
  ASSIGN_OR_RETURN(cuda::DeviceBuffer dst, cuda::DeviceBuffer::Allocate(worker, dst_alloc));
  if (memory.source_random) {
    WSYNC_CUDA_RETURN_IF_ERROR(
        Fill16Strided(src.data(), 1, src.size() / 2, src.size() / 2, 77 + worker, nullptr),
        "probe fill");
    WSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "probe fill");
  } else if (!memory.source_unwritten) {
    WSYNC_CUDA_RETURN_IF_ERROR(cudaMemset(src.data(), 1, src.size()), "probe memset");
  }
  const std::string key = absl::StrCat("probe/", label, "/");
  void* peer = nullptr;
  std::unique_ptr<cuda::IpcRegistry> registry;
  if (memory.registry_open) {
    ASSIGN_OR_RETURN(cuda::IpcTensorHandle h,
                     cuda::ExportTensor(dst.data(), dst.size(), "probe destination"));
    RETURN_IF_ERROR(store.Set(absl::StrCat(key, worker), h.Serialize()));
    ASSIGN_OR_RETURN(std::string text,
                     store.Get(absl::StrCat(key, 1 - worker), absl::Now() + absl::Seconds(60)));
    ASSIGN_OR_RETURN(cuda::IpcTensorHandle theirs, cuda::IpcTensorHandle::Parse(text));
    ASSIGN_OR_RETURN(registry, cuda::IpcRegistry::Create(worker));
    ASSIGN_OR_RETURN(peer, registry->Open(theirs, "probe destination", /*peer=*/true));
  } else {
    cudaIpcMemHandle_t mine;
    WSYNC_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&mine, dst.data()), "probe export");
    RETURN_IF_ERROR(store.Set(absl::StrCat(key, worker), HexOf(mine)));
    ASSIGN_OR_RETURN(std::string text,
                     store.Get(absl::StrCat(key, 1 - worker), absl::Now() + absl::Seconds(60)));
    ASSIGN_OR_RETURN(cudaIpcMemHandle_t theirs, HandleOf(text));
    WSYNC_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&peer, theirs, cudaIpcMemLazyEnablePeerAccess),
                               "probe open");
  }
  void* const peer_base = peer;
  if (memory.destination_doubled) peer = static_cast<char*>(peer) + worker * dst_bytes;
  cudaStream_t stream = nullptr;
  cuda::Stream wsync_stream;
  if (memory.wsync_stream) {
    ASSIGN_OR_RETURN(wsync_stream, cuda::Stream::Create(worker));
    stream = wsync_stream.get();
  } else {
    WSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                               "probe stream");
  }
  std::vector<double> times;
  absl::Status status;
  for (int it = 0; it < iters + 1 && status.ok(); ++it) {
    status = barrier();
    if (!status.ok()) break;
    const double t0 = Now();
    size_t so = 0, doff = 0;
    for (int i = 0; i < kPieces && status.ok(); ++i) {
      const size_t w = Width(i);
      const cudaError_t e = cudaMemcpy2DAsync(static_cast<char*>(peer) + doff, w,
                                              static_cast<const char*>(src.data()) + so + w, 2 * w,
                                              w, kRows, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) status = absl::InternalError(cudaGetErrorString(e));
      so += 2 * w * kRows;
      doff += w * kRows;
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess) status = absl::InternalError("probe sync");
    if (it > 0) times.push_back(Now() - t0);
  }
  // The peer must be done writing this worker's memory before it is freed.
  absl::Status last = barrier();
  if (!memory.wsync_stream) cudaStreamDestroy(stream);
  if (registry == nullptr) cudaIpcCloseMemHandle(peer_base);
  registry.reset();  // closes its mapping
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(last);
  Result(absl::StrFormat(
      R"({"bench":"wsync_ce_probe","worker":%d,"at":"%s","source_unwritten":%d,"source_random":%d,"destination_doubled":%d,"registry_open":%d,"wsync_stream":%d,"destination_extra_bytes":%d,"src":"%p","dst":"%p","peer":"%p","peer_bytes":%d,"median_s":%.6f,"iters":%d})",
      worker, label, memory.source_unwritten, memory.source_random, memory.destination_doubled,
      memory.registry_open, memory.wsync_stream, memory.destination_extra_bytes, src.data(),
      dst.data(), peer, static_cast<int64_t>(dst_bytes), Median(times), iters));
  return absl::OkStatus();
}

absl::Status RunCeProbeMemorySweep(const std::string& prefix, int worker, int iters,
                                   transport::KvStore& store,
                                   const std::function<absl::Status()>& barrier) {
  constexpr int64_t kExtra[] = {0, 0, 0, 0, 0, 65536, 256, 1 << 20, 4096, 32768};
  for (int k = 0; k < 10; ++k) {
    ProbeMemory m;
    m.source_unwritten = k == 0;
    m.source_random = k == 1;
    m.destination_doubled = k == 2;
    m.registry_open = k == 3;
    m.wsync_stream = k == 4;
    m.destination_extra_bytes = kExtra[k];
    RETURN_IF_ERROR(
        RunCeProbe(absl::StrCat(prefix, "/memory", k), worker, iters, store, barrier, m));
  }
  return absl::OkStatus();
}

}  // namespace wsync::bench
