#include "worker/agent/swap_runs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace wsync::agent {

absl::Status AppendSwapRuns(const v1::TensorView& v, int64_t extent,
                            std::vector<std::pair<int64_t, int64_t>>* runs) {
  const int64_t size = DTypeSize(v.dtype());
  if (size <= 0) return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", v.dtype()));
  if (v.byte_offset() < 0 || v.strides_size() < v.shape_size()) {
    return absl::InvalidArgumentError(absl::StrCat("byte offset ", v.byte_offset(), ", ",
                                                   v.shape_size(), " dims and ", v.strides_size(),
                                                   " strides"));
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (extent, stride), outermost first
  for (int d = 0; d < v.shape_size(); ++d) {
    if (v.shape(d) < 0 || v.strides(d) < 0 || (v.strides(d) == 0 && v.shape(d) > 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("dim ", d, " of size ", v.shape(d), " and stride ", v.strides(d)));
    }
    if (v.shape(d) == 0) return absl::OkStatus();  // covers nothing
    if (v.shape(d) != 1) dims.emplace_back(v.shape(d), v.strides(d));
  }
  const auto overflow = [&] {
    return absl::InvalidArgumentError(absl::StrCat("its extent overflows int64 (", dims.size(),
                                                   " strided dims, ", size, "-byte elements)"));
  };
  int64_t run = 1;  // elements of one run: the innermost dims that are dense
  while (!dims.empty() && dims.back().second == run) {
    if (__builtin_mul_overflow(run, dims.back().first, &run)) return overflow();
    dims.pop_back();
  }
  int64_t count = 1, last = run - 1;  // runs; the last element's offset
  for (const auto& [n, stride] : dims) {
    int64_t step = 0;
    if (__builtin_mul_overflow(count, n, &count) || __builtin_mul_overflow(n - 1, stride, &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return overflow();
    }
  }
  int64_t end = 0, run_bytes = 0;
  if (__builtin_add_overflow(last, 1, &end) || __builtin_mul_overflow(end, size, &end) ||
      __builtin_add_overflow(end, v.byte_offset(), &end) ||
      __builtin_mul_overflow(run, size, &run_bytes)) {
    return overflow();
  }
  if (end > extent) {
    return absl::InvalidArgumentError(
        absl::StrCat("it reaches byte ", end, ", past the buffer's extent ", extent));
  }
  if (count > 1 && run_bytes < kMinSwapRunBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("it lists as ", count, " runs of ", run_bytes,
                                                     " bytes (a swap needs runs of at least ",
                                                     kMinSwapRunBytes, " bytes)"));
  }
  if (static_cast<uint64_t>(count) > kMaxSwapRuns - std::min(kMaxSwapRuns, runs->size())) {
    return absl::ResourceExhaustedError(absl::StrCat("its ", count, " runs bring the part past ",
                                                     kMaxSwapRuns, " runs (", runs->size(),
                                                     " before it)"));
  }
  std::vector<int64_t> index(dims.size(), 0);
  for (int64_t k = 0; k < count; ++k) {
    int64_t offset = 0;  // elements; bounded by `last` above
    for (size_t d = 0; d < dims.size(); ++d) offset += index[d] * dims[d].second;
    const int64_t begin = v.byte_offset() + offset * size;
    runs->emplace_back(begin, begin + run_bytes);
    for (size_t d = dims.size(); d-- > 0;) {
      if (++index[d] < dims[d].first) break;
      index[d] = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::agent
