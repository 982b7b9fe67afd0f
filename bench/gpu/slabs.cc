#include "bench/gpu/slabs.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace wsync::bench {

absl::StatusOr<std::map<std::string, BufferNeed>> BuffersOf(const v1::Side& side,
                                                            plan::SideRole role, int32_t worker) {
  std::map<std::string, BufferNeed> out;
  int32_t rank = -1;
  for (int i = 0; i < side.ranks_size(); ++i) {
    if (side.ranks(i).worker() == worker) rank = i;
  }
  if (rank < 0) return out;
  auto compiled = plan::CompileSide(side, role);
  if (!compiled.ok()) return compiled.status();
  for (const auto& t : compiled->tensors) {
    const int64_t es = DTypeSize(t.dtype);
    for (const auto& f : t.fragments()) {
      if (f.rank != rank || f.box.Empty()) continue;
      int64_t last = 0;
      for (size_t d = 0; d < f.strides.size(); ++d) last += (f.box.length[d] - 1) * f.strides[d];
      BufferNeed& need = out[compiled->buffer_names[t.buffer(f)]];
      need.bytes = std::max(need.bytes, f.byte_offset + (last + 1) * es);
      if (need.dtype == v1::DTYPE_UNSPECIFIED) need.dtype = t.dtype;
    }
  }
  return out;
}

Slab::~Slab() {
  if (base && arena == nullptr) cudaFree(base);
}

std::vector<std::pair<std::string, exec::RegisteredBuffer>> CarveSlab(
    const std::map<std::string, BufferNeed>& need, void* base) {
  std::vector<std::pair<std::string, exec::RegisteredBuffer>> out;
  int64_t off = 0;
  for (const auto& [name, n] : need) {
    exec::RegisteredBuffer r;
    r.data = static_cast<char*>(base) + off;
    r.bytes = n.bytes;
    r.dtype = n.dtype;
    r.space = transport::MemorySpace::kCuda;
    out.emplace_back(name, r);
    off += (n.bytes + 255) / 256 * 256;
  }
  return out;
}

absl::Status MakeSlab(const std::map<std::string, BufferNeed>& need, int64_t round_bytes,
                      Slab& slab) {
  int64_t total = 0;
  for (const auto& [name, n] : need) total += (n.bytes + 255) / 256 * 256;
  if (round_bytes > 0) total = (total + round_bytes - 1) / round_bytes * round_bytes;
  slab.bytes = total;
  if (total == 0) return absl::OkStatus();
  if (cudaMalloc(&slab.base, total) != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", total, " bytes"));
  }
  slab.buffers = CarveSlab(need, slab.base);
  return absl::OkStatus();
}

}  // namespace wsync::bench
