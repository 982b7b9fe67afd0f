// Helpers shared by the files of CudaDataOps (cuda_data_ops.cc,
// cuda_data_ops_quant.cc and cuda_data_ops_put.cc); not an API.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_DATA_OPS_INTERNAL_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_DATA_OPS_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/plane/data_ops.h"

namespace wsync::cuda::data_ops_internal {

// INVALID_ARGUMENT naming `what` for a view without a dtype, with a bad rank
// or with null data.
absl::Status CheckView(const exec::StridedView& v, const char* what);
// Row-major element strides of `shape`.
void RowMajor(const int64_t* shape, int ndim, int64_t* strides);
// A pack item's source view and staging: OK, or INVALID_ARGUMENT naming
// "pack item <index>".
absl::Status CheckPackItem(const exec::PackItem& it, const void* staging_base, size_t index);
// Appends the bytes of `v` to a cache key.
template <typename T>
void AppendRaw(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
// Appends `v` to a call's cache key (the calls' items are the keys of
// their resident tables).
void AppendView(std::string& key, const exec::StridedView& v);
// The cache key of a Copy ('C') or Put ('W') call with `items`.
std::string CopyItemsKey(char kind, absl::Span<const exec::CopyItem> items);
// The cache key of a prepared list (exec::ItemsHandle): a few bytes,
// whatever the list's length. `kind` must differ from CopyItemsKey's for the
// same call.
std::string NamedItemsKey(char kind, exec::ItemsHandle handle,
                          absl::Span<const exec::CopyItem> items);
// `s` with "<what> item <index>: " in front of its message.
absl::Status Annotate(const absl::Status& s, const char* what, size_t index);
// Checks copy-like items before anything is enqueued, so that a bad call
// writes nothing: views, equal element counts and, with `check_cast`, a
// conversion the kernel has (errors: "<what> item <index>: ..."). Lists the
// items whose shapes have no common refinement (they go through a
// contiguous scratch copy in the source dtype) and the scratch they need.
absl::Status CheckCopyItems(absl::Span<const exec::CopyItem> items, const char* what,
                            bool check_cast, std::vector<size_t>* via_scratch,
                            int64_t* scratch_bytes);

}  // namespace wsync::cuda::data_ops_internal

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_DATA_OPS_INTERNAL_H_
