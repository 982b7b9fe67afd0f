// Time to open an owner's tensors through CUDA IPC (part of the time to first
// sync): an owner process (the trainer or vLLM) allocates every tensor of a
// catalog model with its own cudaMalloc (what PyTorch's caching allocator does
// for weights above its 1 MiB small-block limit, one segment each) and exports
// them (ExportTensor); a second process on the same GPU (the worker sidecar)
// opens them (IpcRegistry::Open, one cudaIpcOpenMemHandle per allocation).
// Also the same with every tensor carved from one allocation (a packed
// arena: one open in all).
//
//   wsync_bench_ipc_open --model llama3-8b [--device 0]
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/gpu/bench_util.h"
#include "catalog/case.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "worker/backends/cuda/ipc_registry.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  spdlog::error("ipc_open_bench: {}: {}", what, s.ToString());
  return 3;
}

// Bytes of every source tensor of the model (bf16 trainer, one rank).
absl::StatusOr<std::vector<uint64_t>> TensorBytes(const std::string& model) {
  catalog::CaseOptions o;
  o.model = model;
  o.source.shards = 1;
  o.destination.tp = 1;
  auto spec = catalog::BuildCase(o);
  if (!spec.ok()) return spec.status();
  std::vector<uint64_t> out;
  for (const auto& t : spec->source().tensors()) {
    uint64_t n = DTypeSize(t.dtype());
    for (int64_t d : t.shape()) n *= static_cast<uint64_t>(d);
    out.push_back(n);
  }
  return out;
}

// Owner: allocates (per tensor, or one arena), exports, publishes the handles,
// waits until the importer is done.
int Owner(const std::vector<uint64_t>& sizes, bool arena, int device, transport::KvStore& store,
          const std::string& tag) {
  if (cudaSetDevice(device) != cudaSuccess) return Fail("cudaSetDevice", absl::InternalError(""));
  std::vector<void*> allocs;
  std::vector<void*> ptrs;
  double t0 = Now();
  if (arena) {
    uint64_t total = 0;
    for (uint64_t b : sizes) total += (b + 255) / 256 * 256;
    void* p = nullptr;
    if (cudaMalloc(&p, total) != cudaSuccess)
      return Fail("cudaMalloc arena", absl::InternalError(""));
    allocs.push_back(p);
    uint64_t off = 0;
    for (uint64_t b : sizes) {
      ptrs.push_back(static_cast<char*>(p) + off);
      off += (b + 255) / 256 * 256;
    }
  } else {
    for (uint64_t b : sizes) {
      void* p = nullptr;
      if (cudaMalloc(&p, b) != cudaSuccess) return Fail("cudaMalloc", absl::InternalError(""));
      allocs.push_back(p);
      ptrs.push_back(p);
    }
  }
  const double alloc_s = Now() - t0;
  t0 = Now();
  std::vector<std::string> lines;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    auto h = cuda::ExportTensor(ptrs[i], sizes[i], absl::StrCat("t", i));
    if (!h.ok()) return Fail("export", h.status());
    lines.push_back(h->Serialize());
  }
  const double export_s = Now() - t0;
  if (auto s = store.Set(tag + "handles", absl::StrJoin(lines, "\n")); !s.ok()) {
    return Fail("publish", s);
  }
  auto done = store.Get(tag + "done", absl::Now() + absl::Seconds(300));
  if (!done.ok()) return Fail("importer", done.status());
  Result(absl::StrFormat(
      R"({"bench":"ipc_open","role":"owner","layout":"%s","tensors":%d,"allocations":%d,"alloc_s":%.4f,"export_s":%.4f})",
      arena ? "one_arena" : "cudaMalloc_per_tensor", sizes.size(), allocs.size(), alloc_s,
      export_s));
  for (void* p : allocs) cudaFree(p);
  return 0;
}

int Importer(bool arena, int device, transport::KvStore& store, const std::string& tag,
             const std::string& model) {
  auto text = store.Get(tag + "handles", absl::Now() + absl::Seconds(300));
  if (!text.ok()) return Fail("handles", text.status());
  double t0 = Now();
  auto reg = cuda::IpcRegistry::Create(device);
  if (!reg.ok()) return Fail("registry", reg.status());
  const double create_s = Now() - t0;
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  std::vector<cuda::IpcTensorHandle> handles;
  for (const std::string& l : lines) {
    auto h = cuda::IpcTensorHandle::Parse(l);
    if (!h.ok()) return Fail("parse", h.status());
    handles.push_back(*h);
  }
  t0 = Now();
  for (size_t i = 0; i < handles.size(); ++i) {
    auto p = (*reg)->Open(handles[i], absl::StrCat("t", i));
    if (!p.ok()) return Fail("open", p.status());
  }
  const double open_s = Now() - t0;
  Result(absl::StrFormat(
      R"({"bench":"ipc_open","role":"importer","model":"%s","layout":"%s","tensors":%d,"mappings":%d,"registry_create_s":%.4f,"open_s":%.4f,"open_us_per_mapping":%.1f})",
      model, arena ? "one_arena" : "cudaMalloc_per_tensor", handles.size(), (*reg)->num_mappings(),
      create_s, open_s, 1e6 * open_s / std::max<size_t>(1, (*reg)->num_mappings())));
  reg->reset();  // unmaps before the owner frees
  return store.Set(tag + "done", "1").ok() ? 0 : 4;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  wsync::InitLogging("wsync_bench_ipc_open");
  using namespace wsync::bench;
  std::string model = "llama3-8b";
  int device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--model") == 0)
      model = argv[i + 1];
    else if (std::strcmp(argv[i], "--device") == 0)
      device = std::atoi(argv[i + 1]);
    else {
      spdlog::error("unknown flag {}", argv[i]);
      return 2;
    }
  }
  auto sizes = TensorBytes(model);
  if (!sizes.ok()) return Fail("model", sizes.status());
  int rc = 0;
  for (bool arena : {false, true}) {
    const std::string dir = MakeStoreDir("ipc");
    const std::string tag = arena ? "arena/" : "each/";
    std::fflush(stdout);
    rc |= ForkRanks(2, [&](int r) {
      wsync::transport::FileKvStore store(dir);
      return r == 0 ? Owner(*sizes, arena, device, store, tag)
                    : Importer(arena, device, store, tag, model);
    });
  }
  return rc;
}
