#include "bench/gpu/raw_puts.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/bench_util.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_handles.h"
#include "worker/cuda/ipc_registry.h"

namespace wsync::bench {
namespace {

#define RETURN_IF_CUDA_ERROR(x, what)                                               \
  do {                                                                              \
    const cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                        \
      return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e_))); \
    }                                                                               \
  } while (0)

// Bytes spanned by a view (first to last element, inclusive).
int64_t Extent(const exec::StridedView& v) {
  int64_t last = 0;
  for (int d = 0; d < v.ndim; ++d) last += (v.shape[d] - 1) * v.strides[d];
  return (last + 1) * static_cast<int64_t>(DTypeSize(v.dtype));
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
                             void* source_slab, cuda::CudaDataOps& ops, transport::KvStore& store,
                             const std::string& tag, const std::function<absl::Status()>& barrier) {
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
  // Variants 0-3: {slab, fresh} source x {slab, fresh} destination, both
  // directions at once. 4: slab to slab, worker 0 alone writing. 5 and 6:
  // slab to slab and fresh to fresh after a CUDA IPC handle of each source
  // was taken (the two-process replica's sources are exported).
  for (int variant = 0; variant < 7; ++variant) {
    const bool fresh_s = variant < 4 ? (variant & 1) : variant == 6;
    const bool fresh_d = variant < 4 ? (variant & 2) : variant == 6;
    const bool writes = variant != 4 || worker == 0;
    if (variant == 5) {
      cudaIpcMemHandle_t h;
      RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&h, source_slab), "export the source slab");
      RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&h, fresh_src), "export the fresh source");
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
        RETURN_IF_ERROR(ops.Put(items, /*alone=*/true));
        RETURN_IF_ERROR(ops.FinishPuts());
      }
      if (i > 0) raw.push_back(Now() - t0);
    }
    Result(absl::StrFormat(
        R"({"bench":"wsync_raw_puts","worker":%d,"source":"%s","destination":"%s","directions":%d,"sources_exported":%d,"median_s":%.6f})",
        worker, fresh_s ? "fresh" : "slab", fresh_d ? "fresh" : "slab", variant == 4 ? 1 : 2,
        variant >= 5 ? 1 : 0, Median(raw)));
  }
  // No peer may still write this worker's fresh memory when it is freed.
  return barrier();
}

}  // namespace wsync::bench
