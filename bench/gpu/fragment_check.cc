#include "bench/gpu/fragment_check.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/gpu/bench_kernels.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace wsync::bench {
namespace {

struct Dim {
  int64_t length, stride;
};

// Box dims in the buffer, size-1 dims dropped and contiguous dims merged.
std::vector<Dim> Coalesce(const plan::CompiledFragment& f) {
  std::vector<Dim> dims;
  for (size_t d = 0; d < f.strides.size(); ++d) {
    if (f.box.length[d] != 1) dims.push_back({f.box.length[d], f.strides[d]});
  }
  std::vector<Dim> out;
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    if (!out.empty() && dims[d].stride == out.front().length * out.front().stride) {
      out.front().length *= dims[d].length;
    } else {
      out.insert(out.begin(), dims[d]);
    }
  }
  return out;
}

// Calls fn(ptr, rows, cols, row_stride, block) for the 2-D blocks (unit inner
// stride, or cols == 1) the fragment's view is made of.
cudaError_t ForEachBlock(
    char* base, int64_t element_bytes, const plan::CompiledFragment& f,
    const std::function<cudaError_t(char*, int64_t, int64_t, int64_t, int64_t)>& fn) {
  std::vector<Dim> dims = Coalesce(f);
  if (dims.empty()) return fn(base, 1, 1, 1, 0);
  int64_t rows, cols, row_stride;
  size_t outer;
  if (dims.back().stride == 1 && dims.size() >= 2) {
    rows = dims[dims.size() - 2].length;
    row_stride = dims[dims.size() - 2].stride;
    cols = dims.back().length;
    outer = dims.size() - 2;
  } else if (dims.back().stride == 1) {
    rows = 1, cols = dims.back().length, row_stride = cols;
    outer = 0;
  } else {
    rows = dims.back().length, cols = 1, row_stride = dims.back().stride;
    outer = dims.size() - 1;
  }
  int64_t blocks = 1;
  for (size_t d = 0; d < outer; ++d) blocks *= dims[d].length;
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t rem = b, off = 0;
    for (int d = static_cast<int>(outer) - 1; d >= 0; --d) {
      off += (rem % dims[d].length) * dims[d].stride;
      rem /= dims[d].length;
    }
    if (cudaError_t e = fn(base + off * element_bytes, rows, cols, row_stride, b);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

uint64_t SeedOf(const std::string& tensor, const BoxNd& box) {
  return std::hash<std::string>{}(absl::StrCat(tensor, "@", absl::StrJoin(box.offset, ","), "+",
                                               absl::StrJoin(box.length, ",")));
}

int32_t SideRank(const v1::Side& side, int32_t worker) {
  for (int i = 0; i < side.ranks_size(); ++i) {
    if (side.ranks(i).worker() == worker) return i;
  }
  return -1;
}

// Runs fn(tensor, fragment, fragment base pointer) over this worker's
// fragments (only the lowest-rank copy of each box when `distinct`).
absl::Status ForEachFragment(
    const v1::Side& side, plan::SideRole role, int32_t worker, const exec::BufferRegistry& registry,
    bool distinct,
    const std::function<absl::Status(const plan::CompiledTensor&, const plan::CompiledFragment&,
                                     char*)>& fn) {
  const int32_t rank = SideRank(side, worker);
  if (rank < 0) return absl::OkStatus();
  auto compiled = plan::CompileSide(side, role);
  if (!compiled.ok()) return compiled.status();
  const exec::BufferSide bside =
      role == plan::SideRole::kSource ? exec::BufferSide::kSource : exec::BufferSide::kDestination;
  for (const plan::CompiledTensor& t : compiled->tensors) {
    if (DTypeSize(t.dtype) != 2 && DTypeSize(t.dtype) != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name, ": the benchmark check handles 16- and 32-bit dtypes only, not ",
          DTypeName(t.dtype)));
    }
    for (size_t i = 0; i < t.num_fragments(); ++i) {
      const plan::CompiledFragment& f = t.fragment(i);
      if (f.rank != rank || f.box.Empty()) continue;
      // Sorted by (box, rank): the first of equal boxes is the lowest rank.
      if (distinct && i > 0 && t.fragment(i - 1).box == f.box) continue;
      const std::string& name = compiled->buffer_names[t.buffer(f)];
      const exec::RegisteredBuffer* b = registry.Find(bside, name);
      if (b == nullptr) {
        return absl::NotFoundError(absl::StrCat("worker ", worker, ": buffer ", name, " of tensor ",
                                                t.name, " is not registered"));
      }
      RETURN_IF_ERROR(fn(t, f, static_cast<char*>(b->data) + f.byte_offset));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FillSourceFragments(const v1::Side& side, int32_t worker,
                                 const exec::BufferRegistry& registry, cudaStream_t stream) {
  return ForEachFragment(
      side, plan::SideRole::kSource, worker, registry, /*distinct=*/false,
      [&](const plan::CompiledTensor& t, const plan::CompiledFragment& f, char* p) {
        const uint64_t seed = SeedOf(t.name, f.box);
        const int64_t es = DTypeSize(t.dtype);
        const cudaError_t e = ForEachBlock(
            p, es, f, [&](char* q, int64_t rows, int64_t cols, int64_t row_stride, int64_t block) {
              const uint64_t s = seed + 0x9E3779B9ull * block;
              return es == 4 ? Fill32Strided(q, rows, cols, row_stride, s, stream)
                             : Fill16Strided(q, rows, cols, row_stride, s, stream);
            });
        if (e != cudaSuccess) {
          return absl::InternalError(absl::StrCat("fill ", t.name, ": ", cudaGetErrorString(e)));
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<unsigned long long> SideChecksum(const v1::Side& side, plan::SideRole role,
                                                int32_t worker,
                                                const exec::BufferRegistry& registry,
                                                cudaStream_t stream) {
  unsigned long long* d = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), sizeof(*d)) != cudaSuccess) {
    return absl::InternalError("cudaMalloc");
  }
  cudaMemsetAsync(d, 0, sizeof(*d), stream);
  absl::Status s = ForEachFragment(
      side, role, worker, registry, /*distinct=*/true,
      [&](const plan::CompiledTensor& t, const plan::CompiledFragment& f, char* p) {
        const int64_t es = DTypeSize(t.dtype);
        const cudaError_t e = ForEachBlock(
            p, es, f, [&](char* q, int64_t rows, int64_t cols, int64_t row_stride, int64_t) {
              return es == 4 ? ChecksumUpper16Strided(q, rows, cols, row_stride, d, stream)
                             : Checksum16Strided(q, rows, cols, row_stride, d, stream);
            });
        if (e != cudaSuccess) {
          return absl::InternalError(
              absl::StrCat("checksum ", t.name, ": ", cudaGetErrorString(e)));
        }
        return absl::OkStatus();
      });
  unsigned long long h = 0;
  cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, stream);
  const cudaError_t e = cudaStreamSynchronize(stream);
  cudaFree(d);
  if (!s.ok()) return s;
  if (e != cudaSuccess) return absl::InternalError(cudaGetErrorString(e));
  return h;
}

}  // namespace wsync::bench
