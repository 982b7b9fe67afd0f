// What a pointer-stable commit would cost (issue 20, item 3: "the commit
// itself is a local copy, or pointer-stable swap where the owner allows").
// One cuMem allocation per destination tensor of a catalog case's receiver
// (as vLLM's sleep-mode allocator makes them), each with a shadow
// allocation of the same size; then, in one process on one GPU:
//   copy:  the copy commit, shadow -> live, every tensor (cudaMemcpyAsync);
//   swap:  exchange the physical memory behind the live and the shadow
//          addresses (cuMemUnmap both, cuMemMap crossed, cuMemSetAccess both);
//          neither address changes, so captured CUDA graphs stay valid.
// With --arena 1 every tensor lives in one allocation (an owner that puts
// its weights in one cuMem arena): one swap for all of them.
//   two-step: the swap as CudaSwapArena does it (plane::SwapArena::BeginSwap /
//          FinishSwap): the live range is remapped onto the shadow's memory
//          first (the pause ends there), then the shadow's range.
// --align-mib N reserves every range aligned to N MiB (0: the granularity).
// --probe R (with --arena 1): R fresh arenas in turn, each pause timed per
// driver call, and with the twin's range unmapped first ("wsync_vmm_probe");
// --round-mib N with it: the arena's size rounded up to N MiB (whole large
// pages: do they remap faster?).
// --chunks C --threads T (with --arena 1): the live range mapped as C
// allocations mapped side by side, and the two-step pause's remap done by T
// threads, each remapping its share of the chunks (is the driver's
// page-table work parallel?). Prints a second RESULT, "wsync_vmm_swap_chunks".
// Checks that after a swap the live address reads the shadow's bytes.
//
//   wsync_bench_vmm_swap --model llama3-8b [--mode tp1] [--worker 1] [--iters 5] [--arena 0]
//       [--align-mib 0] [--chunks 0 --threads 1] [--probe 0 [--round-mib 0]]
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu/bench_cases.h"
#include "bench/gpu/bench_util.h"
#include "bench/gpu/slabs.h"
#include "common/logging.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::bench {
namespace {

struct Mapping {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
  size_t bytes = 0;
};

void CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(3);
}

int Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return 0;
  std::fprintf(stderr, "%s: %s\n", what, cuda::DriverErrorText(r).c_str());
  std::exit(3);
}

Mapping MapNew(const cuda::DriverApi& api, const CUmemAllocationProp& prop,
               const CUmemAccessDesc& access, size_t bytes, size_t align) {
  Mapping m;
  m.bytes = bytes;
  Check(api.cuMemCreate(&m.handle, bytes, &prop, 0), "cuMemCreate");
  Check(api.cuMemAddressReserve(&m.va, bytes, align, 0, 0), "cuMemAddressReserve");
  Check(api.cuMemMap(m.va, bytes, 0, m.handle, 0), "cuMemMap");
  Check(api.cuMemSetAccess(m.va, bytes, &access, 1), "cuMemSetAccess");
  return m;
}

// Live and shadow trade their physical memory; both addresses stay.
void Swap(const cuda::DriverApi& api, const CUmemAccessDesc& access, Mapping& live,
          Mapping& shadow) {
  Check(api.cuMemUnmap(live.va, live.bytes), "cuMemUnmap live");
  Check(api.cuMemUnmap(shadow.va, shadow.bytes), "cuMemUnmap shadow");
  Check(api.cuMemMap(live.va, live.bytes, 0, shadow.handle, 0), "cuMemMap live");
  Check(api.cuMemMap(shadow.va, shadow.bytes, 0, live.handle, 0), "cuMemMap shadow");
  Check(api.cuMemSetAccess(live.va, live.bytes, &access, 1), "cuMemSetAccess live");
  Check(api.cuMemSetAccess(shadow.va, shadow.bytes, &access, 1), "cuMemSetAccess shadow");
  std::swap(live.handle, shadow.handle);
}

// The same in two steps; returns the seconds until the live range is back.
double SwapTwoSteps(const cuda::DriverApi& api, const CUmemAccessDesc& access, Mapping& live,
                    Mapping& shadow, double t0) {
  Check(api.cuMemUnmap(live.va, live.bytes), "cuMemUnmap live");
  Check(api.cuMemMap(live.va, live.bytes, 0, shadow.handle, 0), "cuMemMap live");
  Check(api.cuMemSetAccess(live.va, live.bytes, &access, 1), "cuMemSetAccess live");
  const double pause = Now() - t0;
  Check(api.cuMemUnmap(shadow.va, shadow.bytes), "cuMemUnmap shadow");
  Check(api.cuMemMap(shadow.va, shadow.bytes, 0, live.handle, 0), "cuMemMap shadow");
  Check(api.cuMemSetAccess(shadow.va, shadow.bytes, &access, 1), "cuMemSetAccess shadow");
  std::swap(live.handle, shadow.handle);
  return pause;
}

// --probe R: R rounds, each with a fresh live and twin allocation of the
// arena's size: `iters` two-step pauses timed per driver call (unmap, map,
// set access), then the same with the twin's range unmapped before the
// pause (does a second mapping of the memory cost the remap?). One RESULT
// per round: is the pause a property of the allocation or of the process?
void RunProbe(const cuda::DriverApi& api, const CUmemAllocationProp& prop,
              const CUmemAccessDesc& access, size_t total, size_t align, int rounds, int iters,
              const std::string& model, const std::string& mode, int worker) {
  for (int r = 0; r < rounds; ++r) {
    Mapping live = MapNew(api, prop, access, total, align);
    Mapping twin = MapNew(api, prop, access, total, align);
    CudaCheck(cudaMemset(reinterpret_cast<void*>(live.va), 1, total), "cudaMemset");
    CudaCheck(cudaDeviceSynchronize(), "fill");
    std::vector<double> unmap_s, map_s, access_s, pause_s, alone_s;
    for (int i = 0; i < 2 * iters; ++i) {
      const bool twin_unmapped = i >= iters;
      if (twin_unmapped) Check(api.cuMemUnmap(twin.va, total), "cuMemUnmap twin (before)");
      CudaCheck(cudaDeviceSynchronize(), "sync");
      const double t0 = Now();
      Check(api.cuMemUnmap(live.va, total), "cuMemUnmap live");
      const double t1 = Now();
      Check(api.cuMemMap(live.va, total, 0, twin.handle, 0), "cuMemMap live");
      const double t2 = Now();
      Check(api.cuMemSetAccess(live.va, total, &access, 1), "cuMemSetAccess live");
      const double t3 = Now();
      if (twin_unmapped) {
        alone_s.push_back(t3 - t0);
      } else {
        unmap_s.push_back(t1 - t0);
        map_s.push_back(t2 - t1);
        access_s.push_back(t3 - t2);
        pause_s.push_back(t3 - t0);
        Check(api.cuMemUnmap(twin.va, total), "cuMemUnmap twin");
      }
      Check(api.cuMemMap(twin.va, total, 0, live.handle, 0), "cuMemMap twin");
      Check(api.cuMemSetAccess(twin.va, total, &access, 1), "cuMemSetAccess twin");
      std::swap(live.handle, twin.handle);
    }
    Result(absl::StrFormat(
        R"({"bench":"wsync_vmm_probe","model":"%s","mode":"%s","worker":%d,"round":%d,"bytes":%d,"live_va":"%#x","pause_median_s":%.6f,"unmap_median_s":%.6f,"map_median_s":%.6f,"set_access_median_s":%.6f,"twin_unmapped_pause_median_s":%.6f})",
        model, mode, worker, r, total, live.va, Median(pause_s), Median(unmap_s), Median(map_s),
        Median(access_s), Median(alone_s)));
    for (Mapping* m : {&live, &twin}) {
      Check(api.cuMemUnmap(m->va, total), "cuMemUnmap");
      Check(api.cuMemRelease(m->handle), "cuMemRelease");
      Check(api.cuMemAddressFree(m->va, total), "cuMemAddressFree");
    }
  }
}

// The live range as `chunks` allocations mapped side by side; the pause remaps
// every chunk onto the twin's allocation (same offset) with `threads` threads
// that wait on a spin barrier (their start-up is not timed). Returns the
// median pause; the twin's range is then remapped untimed.
// cuMemMap maps a whole allocation (its offset must be 0), so a chunked
// range is one allocation per chunk.
struct ChunkedRange {
  CUdeviceptr va = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

int RunChunked(const cuda::DriverApi& api, const CUmemAllocationProp& prop,
               const CUmemAccessDesc& access, size_t total, size_t gran, size_t align, int chunks,
               int threads, int iters, const std::string& model, const std::string& mode,
               int worker) {
  const size_t per = (total / chunks + gran - 1) / gran * gran;
  total = per * chunks;
  ChunkedRange live, twin;
  for (ChunkedRange* r : {&live, &twin}) {
    Check(api.cuMemAddressReserve(&r->va, total, align, 0, 0), "cuMemAddressReserve");
    r->handles.resize(chunks);
    for (int c = 0; c < chunks; ++c) {
      Check(api.cuMemCreate(&r->handles[c], per, &prop, 0), "cuMemCreate chunk");
      Check(api.cuMemMap(r->va + c * per, per, 0, r->handles[c], 0), "cuMemMap chunk");
    }
    Check(api.cuMemSetAccess(r->va, total, &access, 1), "cuMemSetAccess");
  }
  CudaCheck(cudaMemset(reinterpret_cast<void*>(live.va), 1, total), "cudaMemset");
  CudaCheck(cudaMemset(reinterpret_cast<void*>(twin.va), 2, total), "cudaMemset");
  CudaCheck(cudaDeviceSynchronize(), "fill");
  // Remaps range `at`'s chunks [t, t + threads, ...) onto `handles`.
  using Handles = std::vector<CUmemGenericAllocationHandle>;
  auto remap_share = [&](CUdeviceptr at, const Handles* handles, int t) {
    for (int c = t; c < chunks; c += threads) {
      const CUdeviceptr p = at + c * per;
      Check(api.cuMemUnmap(p, per), "cuMemUnmap chunk");
      Check(api.cuMemMap(p, per, 0, (*handles)[c], 0), "cuMemMap chunk");
      Check(api.cuMemSetAccess(p, per, &access, 1), "cuMemSetAccess chunk");
    }
  };
  std::atomic<int> generation{0}, done{0};
  std::atomic<bool> stop{false};
  CUdeviceptr job_at = 0;
  const Handles* job_handles = nullptr;
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cudaSetDevice(0);
      int seen = 0;
      while (true) {
        while (generation.load(std::memory_order_acquire) == seen && !stop.load()) {
        }
        if (stop.load()) return;
        seen = generation.load(std::memory_order_acquire);
        remap_share(job_at, job_handles, t);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  auto remap_all = [&](CUdeviceptr at, const Handles* handles) {
    job_at = at;
    job_handles = handles;
    done.store(0);
    generation.fetch_add(1, std::memory_order_acq_rel);
    remap_share(at, handles, 0);
    while (done.load(std::memory_order_acquire) < threads - 1) {
    }
  };
  std::vector<double> pause_s;
  int bad = 0;
  for (int i = 0; i < iters; ++i) {
    const double t0 = Now();
    cudaDeviceSynchronize();
    remap_all(live.va, &twin.handles);  // the pause: live now reads the twin's memory
    pause_s.push_back(Now() - t0);
    remap_all(twin.va, &live.handles);
    std::swap(live.handles, twin.handles);
    unsigned char first = 0, last = 0;
    const unsigned char want = i % 2 == 0 ? 2 : 1;
    cudaMemcpy(&first, reinterpret_cast<void*>(live.va), 1, cudaMemcpyDeviceToHost);
    cudaMemcpy(&last, reinterpret_cast<void*>(live.va + total - 1), 1, cudaMemcpyDeviceToHost);
    if (first != want || last != want) ++bad;
  }
  stop.store(true);
  for (auto& th : pool) th.join();
  Result(absl::StrFormat(
      R"({"bench":"wsync_vmm_swap_chunks","model":"%s","mode":"%s","worker":%d,"bytes":%d,"chunks":%d,"threads":%d,"align":%d,"iters":%d,"pause_median_s":%.6f,"pause_min_s":%.6f,"checks_failed":%d})",
      model, mode, worker, total, chunks, threads, align, iters, Median(pause_s),
      *std::min_element(pause_s.begin(), pause_s.end()), bad));
  for (ChunkedRange* r : {&live, &twin}) {
    for (int c = 0; c < chunks; ++c) {
      api.cuMemUnmap(r->va + c * per, per);
      api.cuMemRelease(r->handles[c]);
    }
    api.cuMemAddressFree(r->va, total);
  }
  return bad == 0 ? 0 : 6;
}

int Run(const std::string& model, const std::string& mode, int worker, int iters, bool arena,
        size_t align, int chunks, int threads, int probe, size_t round_bytes) {
  CaseParams params;
  params.model = model;
  auto c = MakeCase(params, mode);
  if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().ToString().c_str()), 2;
  auto need = BuffersOf(c->spec.destination(), plan::SideRole::kDestination, worker);
  if (!need.ok()) return std::fprintf(stderr, "%s\n", need.status().ToString().c_str()), 2;
  auto api_or = cuda::GetDriverApi();
  if (!api_or.ok()) return std::fprintf(stderr, "%s\n", api_or.status().ToString().c_str()), 2;
  const cuda::DriverApi& api = **api_or;
  cudaSetDevice(0);
  cudaFree(nullptr);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  Check(api.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "granularity");
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::vector<Mapping> live, shadow;
  int64_t bytes = 0;
  std::vector<size_t> sizes;
  for (const auto& [name, n] : *need) {
    sizes.push_back((static_cast<size_t>(n.bytes) + gran - 1) / gran * gran);
    bytes += n.bytes;
  }
  if (arena) {
    size_t total = 0;
    for (size_t s : sizes) total += s;
    sizes = {total};
    if (probe > 0) {
      // --round-mib: the size rounded up to N MiB, then to the granularity.
      if (round_bytes > 0) total = (total + round_bytes - 1) / round_bytes * round_bytes;
      total = (total + gran - 1) / gran * gran;
      RunProbe(api, prop, access, total, align, probe, iters, model, mode, worker);
      return 0;
    }
    if (chunks > 0) {
      return RunChunked(api, prop, access, total, gran, align, chunks, std::max(1, threads), iters,
                        model, mode, worker);
    }
  }
  for (size_t size : sizes) {
    live.push_back(MapNew(api, prop, access, size, align));
    shadow.push_back(MapNew(api, prop, access, size, align));
    CudaCheck(cudaMemset(reinterpret_cast<void*>(live.back().va), 1, size), "cudaMemset");
    CudaCheck(cudaMemset(reinterpret_cast<void*>(shadow.back().va), 2, size), "cudaMemset");
  }
  cudaStream_t stream;
  CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  CudaCheck(cudaDeviceSynchronize(), "fill");
  std::vector<double> copy_s, swap_s;
  for (int i = 0; i < iters; ++i) {
    double t0 = Now();
    for (size_t k = 0; k < live.size(); ++k) {
      CudaCheck(cudaMemcpyAsync(reinterpret_cast<void*>(live[k].va),
                                reinterpret_cast<const void*>(shadow[k].va), live[k].bytes,
                                cudaMemcpyDeviceToDevice, stream),
                "copy commit");
    }
    CudaCheck(cudaStreamSynchronize(stream), "copy commit");
    copy_s.push_back(Now() - t0);
  }
  // Re-mark so the swap check is meaningful: live 1, shadow 2.
  for (size_t k = 0; k < live.size(); ++k) {
    cudaMemset(reinterpret_cast<void*>(live[k].va), 1, live[k].bytes);
    cudaMemset(reinterpret_cast<void*>(shadow[k].va), 2, shadow[k].bytes);
  }
  cudaDeviceSynchronize();
  int bad = 0;
  for (int i = 0; i < iters; ++i) {
    double t0 = Now();
    cudaDeviceSynchronize();  // nothing may read the live memory while it is unmapped
    for (size_t k = 0; k < live.size(); ++k) Swap(api, access, live[k], shadow[k]);
    swap_s.push_back(Now() - t0);
    unsigned char first = 0, last = 0;
    const unsigned char want = i % 2 == 0 ? 2 : 1;
    for (size_t k = 0; k < live.size(); ++k) {
      cudaMemcpy(&first, reinterpret_cast<void*>(live[k].va), 1, cudaMemcpyDeviceToHost);
      cudaMemcpy(&last, reinterpret_cast<void*>(live[k].va + live[k].bytes - 1), 1,
                 cudaMemcpyDeviceToHost);
      if (first != want || last != want) ++bad;
    }
  }
  // Two steps: live first (the pause), then the shadow.
  std::vector<double> pause_s, two_step_s;
  for (int i = 0; i < iters; ++i) {
    double t0 = Now();
    cudaDeviceSynchronize();
    double pause = 0;
    for (size_t k = 0; k < live.size(); ++k) {
      pause = SwapTwoSteps(api, access, live[k], shadow[k], t0);
    }
    two_step_s.push_back(Now() - t0);
    pause_s.push_back(pause);  // the last range's: every live range was back by then
    unsigned char first = 0;
    const unsigned char want = (iters + i) % 2 == 0 ? 2 : 1;
    for (size_t k = 0; k < live.size(); ++k) {
      cudaMemcpy(&first, reinterpret_cast<void*>(live[k].va), 1, cudaMemcpyDeviceToHost);
      if (first != want) ++bad;
    }
  }
  Result(absl::StrFormat(
      R"({"bench":"wsync_vmm_swap","model":"%s","mode":"%s","worker":%d,"arena":%d,"mappings":%d,"tensors":%d,"bytes":%d,"granularity":%d,"iters":%d,"copy_median_s":%.6f,"swap_median_s":%.6f,"swap_per_mapping_us":%.2f,"copy_gbps":%.1f,"swap_checks_failed":%d,"align":%d,"two_step_median_s":%.6f,"two_step_pause_median_s":%.6f})",
      model, mode, worker, arena ? 1 : 0, live.size(), need->size(), bytes, gran, iters,
      Median(copy_s), Median(swap_s), 1e6 * Median(swap_s) / std::max<size_t>(1, live.size()),
      bytes / Median(copy_s) / 1e9, bad, align, Median(two_step_s), Median(pause_s)));
  return bad == 0 ? 0 : 6;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  wsync::InitLogging("wsync_bench_vmm_swap");
  std::string model = "llama3-8b", mode = "tp1";
  int worker = 1, iters = 5;
  bool arena = false;
  size_t align = 0;
  int chunks = 0, threads = 1, probe = 0;
  size_t round_bytes = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      model = v;
    else if (k == "--mode")
      mode = v;
    else if (k == "--worker")
      worker = std::stoi(v);
    else if (k == "--iters")
      iters = std::stoi(v);
    else if (k == "--arena")
      arena = v != "0";
    else if (k == "--align-mib")
      align = static_cast<size_t>(std::stoull(v)) << 20;
    else if (k == "--chunks")
      chunks = std::stoi(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--probe")
      probe = std::stoi(v);
    else if (k == "--round-mib")
      round_bytes = static_cast<size_t>(std::stoull(v)) << 20;
    else
      return std::fprintf(stderr, "unknown flag %s\n", k.c_str()), 2;
  }
  if ((probe > 0 || round_bytes > 0) && (!arena || probe <= 0)) {
    return std::fprintf(stderr, "--probe needs --arena 1; --round-mib needs --probe\n"), 2;
  }
  return wsync::bench::Run(model, mode, worker, iters, arena, align, chunks, threads, probe,
                           round_bytes);
}
