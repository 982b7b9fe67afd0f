#include "bench/gpu/raw_puts.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/bench_util.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/ipc_registry.h"

namespace wsync::bench {
namespace {

// Bytes spanned by a view (first to last element, inclusive).
int64_t Extent(const exec::StridedView& v) {
  int64_t last = 0;
  for (int d = 0; d < v.ndim; ++d) last += (v.shape[d] - 1) * v.strides[d];
  return (last + 1) * static_cast<int64_t>(DTypeSize(v.dtype));
}

// Variant 7: the plan's puts, fresh to fresh, as bare cudaMemcpy2DAsync on a
// new stream. Variant 8: ipc_put_bench's push_ce copies (64 pieces of 2048
// rows, 4 and 14 KiB wide, out of rows twice as long), fresh to fresh.
absl::Status TimeBareCopies(int iters, int worker, const std::vector<exec::CopyItem>& puts,
                            void* fresh_src, int64_t src_bytes, char* peer_dst, int64_t dst_bytes,
                            transport::KvStore& store, const std::string& tag,
                            const std::function<absl::Status()>& barrier) {
  struct Copy {
    char* dst;
    const char* src;
    size_t width, height, src_pitch, dst_pitch;
  };
  std::vector<Copy> plan_copies, replica_copies;
  int64_t so = 0, doff = 0;
  for (const exec::CopyItem& it : puts) {
    const int64_t es = DTypeSize(it.src.dtype);
    const int n = it.src.ndim;
    Copy c;
    c.src = static_cast<const char*>(fresh_src) + so;
    c.dst = peer_dst + doff;
    if (n >= 1 && it.src.strides[n - 1] == 1 && it.dst.strides[n - 1] == 1 &&
        (n == 1 || (n == 2 && it.src.dtype == it.dst.dtype))) {
      c.width = static_cast<size_t>(it.src.shape[n - 1] * es);
      c.height = n == 2 ? static_cast<size_t>(it.src.shape[0]) : 1;
      c.src_pitch = n == 2 ? static_cast<size_t>(it.src.strides[0] * es) : c.width;
      c.dst_pitch = n == 2 ? static_cast<size_t>(it.dst.strides[0] * es) : c.width;
      plan_copies.push_back(c);
    }
    so += (Extent(it.src) + 4095) / 4096 * 4096;
    doff += (Extent(it.dst) + 4095) / 4096 * 4096;
  }
  // Memory allocated here, as a probe allocates it (ce_probe.cc), to tell
  // which side's memory makes the difference.
  constexpr int64_t kReplicaBytes = int64_t{1152} << 20;
  ASSIGN_OR_RETURN(cuda::DeviceBuffer src2,
                   cuda::DeviceBuffer::Allocate(worker, 2 * kReplicaBytes));
  ASSIGN_OR_RETURN(cuda::DeviceBuffer dst2,
                   cuda::DeviceBuffer::Allocate(worker, 2 * kReplicaBytes));
  WSYNC_CUDA_RETURN_IF_ERROR(cudaMemset(src2.data(), 1, src2.size()), "memset src2");
  auto h2 = cuda::ExportTensor(dst2.data(), dst2.size(), "dst2");
  if (!h2.ok()) return h2.status();
  RETURN_IF_ERROR(store.Set(absl::StrCat(tag, "dst2/", worker), h2->Serialize()));
  ASSIGN_OR_RETURN(std::string text2, store.Get(absl::StrCat(tag, "dst2/", 1 - worker),
                                                absl::Now() + absl::Seconds(60)));
  ASSIGN_OR_RETURN(cuda::IpcTensorHandle ph2, cuda::IpcTensorHandle::Parse(text2));
  ASSIGN_OR_RETURN(auto ipc2, cuda::IpcRegistry::Create(worker));
  ASSIGN_OR_RETURN(void* peer_dst2_base, ipc2->Open(ph2, "dst2", /*peer=*/true));
  char* const peer_dst2 = static_cast<char*>(peer_dst2_base) + worker * kReplicaBytes;
  Result(absl::StrFormat(
      R"({"bench":"wsync_raw_puts_addresses","worker":%d,"fresh_src":"%p","peer_region":"%p","src2":"%p","peer_dst2":"%p","src_bytes":%d,"dst_bytes":%d})",
      worker, fresh_src, peer_dst, src2.data(), peer_dst2, src_bytes, dst_bytes));
  // `dst`: where this writer's region of the peer's memory starts.
  auto replica = [&](char* dst, int64_t room, const void* src_base = nullptr,
                     int64_t src_room = 0) {
    if (src_base == nullptr) {
      src_base = fresh_src;
      src_room = src_bytes;
    }
    std::vector<Copy> out;
    int64_t rs = 0, rd = 0;
    for (int i = 0; i < 64; ++i) {
      const size_t w = i < 32 ? 4096 : 14336;
      const size_t rows = 2048;
      if (rs + 2 * static_cast<int64_t>(w * rows) > src_room ||
          rd + static_cast<int64_t>(w * rows) > room) {
        break;
      }
      out.push_back(Copy{dst + rd, static_cast<const char*>(src_base) + rs + w, w, rows, 2 * w, w});
      rs += 2 * static_cast<int64_t>(w * rows);
      rd += static_cast<int64_t>(w * rows);
    }
    return out;
  };
  // The region of writer 1 starts dst_bytes in: only 4 KiB aligned.
  char* const peer_region = peer_dst;
  char* const peer_base = peer_dst - worker * dst_bytes;
  constexpr int64_t k2M = int64_t{2} << 20;
  const int64_t aligned_offset = worker * ((dst_bytes + k2M - 1) / k2M * k2M);
  struct Variant {
    const char* name;
    std::vector<Copy> copies;
    bool memset_first;
  };
  std::vector<Variant> variants = {
      {"bare_plan_copies", plan_copies, false},
      {"bare_replica_copies", replica(peer_region, dst_bytes), false},
      {"bare_replica_copies_dst_2m_aligned",
       replica(peer_base + aligned_offset, 2 * dst_bytes - aligned_offset), false},
      {"bare_replica_copies_src_memset", replica(peer_region, dst_bytes), true},
      {"bare_replica_copies_src_memset_dst_2m_aligned",
       replica(peer_base + aligned_offset, 2 * dst_bytes - aligned_offset), true},
  };
  variants.push_back(
      {"new_src_new_dst", replica(peer_dst2, kReplicaBytes, src2.data(), src2.size()), false});
  variants.push_back(
      {"new_src_old_dst", replica(peer_region, dst_bytes, src2.data(), src2.size()), false});
  variants.push_back({"old_src_new_dst", replica(peer_dst2, kReplicaBytes), false});
  variants.push_back({"bare_replica_copies_flags_stream", replica(peer_region, dst_bytes), false});
  ASSIGN_OR_RETURN(cuda::Stream wsync_stream, cuda::Stream::Create(worker));
  cudaStream_t flags_stream = nullptr;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&flags_stream, cudaStreamNonBlocking),
                             "stream");
  for (const Variant& v : variants) {
    const bool flags = &v == &variants.back();
    cudaStream_t stream = flags ? flags_stream : wsync_stream.get();
    if (v.memset_first) {
      WSYNC_CUDA_RETURN_IF_ERROR(cudaMemset(fresh_src, 1, src_bytes), "memset the fresh source");
      WSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "memset the fresh source");
    }
    const std::vector<Copy>& copies = v.copies;
    int64_t bytes = 0;
    for (const Copy& c : copies) bytes += static_cast<int64_t>(c.width * c.height);
    std::vector<double> raw;
    for (int i = 0; i < iters + 1; ++i) {
      RETURN_IF_ERROR(barrier());
      const double t0 = Now();
      for (const Copy& c : copies) {
        WSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch,
                                                     c.width, c.height, cudaMemcpyDefault, stream),
                                   "bare cudaMemcpy2DAsync");
      }
      WSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "bare copies");
      if (i > 0) raw.push_back(Now() - t0);
    }
    Result(absl::StrFormat(
        R"({"bench":"wsync_raw_puts","worker":%d,"variant":"%s","copies":%d,"bytes":%d,"directions":2,"median_s":%.6f})",
        worker, v.name, static_cast<int>(copies.size()), bytes, Median(raw)));
  }
  cudaStreamDestroy(flags_stream);
  return absl::OkStatus();
}

}  // namespace

// Diagnosis: the plan's direct writes alone, straight through the data ops
// (no executor, no tokens), from the source slab or from a fresh allocation
// of this process, into the peer's destination slab or into a fresh
// allocation of the peer's (exported and opened like the slab); also one
// direction alone, and after the sources were exported. Each item keeps its
// shape and strides; only its base moves. The export variants come last:
// exporting cannot be undone.
absl::Status DiagnoseRawPuts(int iters, int worker, const std::vector<exec::CopyItem>& puts,
                             void* source_slab, cuda::CudaPeerWriter& writer,
                             transport::KvStore& store, const std::string& tag,
                             const std::function<absl::Status()>& barrier,
                             const std::function<absl::Status(const std::string&)>& probe) {
  RETURN_IF_ERROR(probe("raw_puts_entry"));
  constexpr int kWorkers = 2;  // one peer: each writer has its own region of its fresh memory
  int64_t src_bytes = 0, dst_bytes = 0;
  for (const exec::CopyItem& it : puts) {
    src_bytes += (Extent(it.src) + 4095) / 4096 * 4096;
    dst_bytes += (Extent(it.dst) + 4095) / 4096 * 4096;
  }
  ASSIGN_OR_RETURN(cuda::DeviceBuffer fresh_src_buffer,
                   cuda::DeviceBuffer::Allocate(worker, std::max<int64_t>(src_bytes, 4096)));
  // The peers write here.
  ASSIGN_OR_RETURN(
      cuda::DeviceBuffer fresh_dst_buffer,
      cuda::DeviceBuffer::Allocate(worker, std::max<int64_t>(kWorkers * dst_bytes, 4096)));
  void* fresh_src = fresh_src_buffer.data();
  auto h =
      cuda::ExportTensor(fresh_dst_buffer.data(), fresh_dst_buffer.size(), "fresh destination");
  if (!h.ok()) return h.status();
  RETURN_IF_ERROR(store.Set(absl::StrCat(tag, "fresh/", worker), h->Serialize()));
  // Every item's peer, from the plan: this worker writes only its own peers.
  std::map<int32_t, char*> peer_fresh;
  auto ipc = cuda::IpcRegistry::Create(worker);
  if (!ipc.ok()) return ipc.status();
  for (int peer = 0; peer < kWorkers; ++peer) {
    if (peer == worker) continue;
    auto text = store.Get(absl::StrCat(tag, "fresh/", peer), absl::Now() + absl::Seconds(60));
    if (!text.ok()) return text.status();
    auto ph = cuda::IpcTensorHandle::Parse(*text);
    if (!ph.ok()) return ph.status();
    auto base = (*ipc)->Open(*ph, "fresh destination", /*peer=*/true);
    if (!base.ok()) return base.status();
    peer_fresh[peer] = static_cast<char*>(*base);
  }
  RETURN_IF_ERROR(probe("raw_puts_memory_mapped"));
  // Variants 0-3: {slab, fresh} source x {slab, fresh} destination, both
  // directions at once. 4: slab to slab, worker 0 alone writing. 5 and 6:
  // slab to slab and fresh to fresh after a CUDA IPC handle of each source
  // was taken (the two-process replica's sources are exported).
  for (int variant = 0; variant < 7; ++variant) {
    if (variant == 5) {
      // Before the export, which cannot be undone: the same copies without
      // CudaDataOps, then the two-process replica's own copies, in this process.
      RETURN_IF_ERROR(TimeBareCopies(iters, worker, puts, fresh_src, src_bytes,
                                     peer_fresh.begin()->second + worker * dst_bytes, dst_bytes,
                                     store, tag, barrier));
    }
    const bool fresh_s = variant < 4 ? (variant & 1) : variant == 6;
    const bool fresh_d = variant < 4 ? (variant & 2) : variant == 6;
    const bool writes = variant != 4 || worker == 0;
    if (variant == 5) {
      cudaIpcMemHandle_t h;
      WSYNC_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, source_slab), "export the source slab");
      WSYNC_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, fresh_src), "export the fresh source");
    }
    std::vector<exec::CopyItem> items = puts;
    int64_t so = 0, doff = 0;
    for (exec::CopyItem& it : items) {
      if (fresh_s) it.src.data = static_cast<char*>(fresh_src) + so;
      if (fresh_d) {
        // 2 workers: the only peer. Each writer has its own region.
        char* base = peer_fresh.begin()->second + worker * dst_bytes;
        it.dst.data = base + doff;
      }
      so += (Extent(it.src) + 4095) / 4096 * 4096;
      doff += (Extent(it.dst) + 4095) / 4096 * 4096;
    }
    std::vector<double> raw;
    for (int i = 0; i < iters + 1; ++i) {
      RETURN_IF_ERROR(barrier());
      const double t0 = Now();
      if (writes) {
        RETURN_IF_ERROR(writer.Put(items, {}, /*alone=*/true));
        RETURN_IF_ERROR(writer.Fence());
      }
      if (i > 0) raw.push_back(Now() - t0);
    }
    Result(absl::StrFormat(
        R"({"bench":"wsync_raw_puts","worker":%d,"source":"%s","destination":"%s","directions":%d,"sources_exported":%d,"median_s":%.6f})",
        worker, fresh_s ? "fresh" : "slab", fresh_d ? "fresh" : "slab", variant == 4 ? 1 : 2,
        variant >= 5 ? 1 : 0, Median(raw)));
  }
  RETURN_IF_ERROR(probe("raw_puts_done"));
  // No peer may still write this worker's fresh memory when it is freed.
  return barrier();
}

}  // namespace wsync::bench
