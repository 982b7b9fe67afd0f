// Host side of the batched kernels: turns strided copy / reduce requests into
// a table of normalized pieces and bounded tasks (no CUDA calls here, so the
// normalization is unit-tested without a GPU). Requests take fixed arrays, not
// vectors: a sync adds tens of thousands of them and must not allocate per item.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_PIECE_TABLE_H_
#define WSYNC_WORKER_BACKENDS_CUDA_PIECE_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "worker/backends/cuda/piece_desc.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::cuda {

// Most dims a request may have (matches exec::kMaxViewDims).
inline constexpr int kMaxRequestDims = 8;

// Strided memory: element i (multi-index over the request's shape) is at
// data + elem_size(dtype) * dot(i, strides).
struct ViewRef {
  const void* data = nullptr;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  const int64_t* strides = nullptr;  // ndim entries
};

// True for the conversions the kernel performs; the same set as
// wsync::CanConvert (same dtype; any float dtype to any float dtype).
bool KernelSupportsCast(DType from, DType to);

class PieceTable {
 public:
  // Largest task in elements: small enough that one launch balances well over
  // all SMs, big enough that the per-task bookkeeping is negligible.
  static constexpr int64_t kTaskElements = int64_t{1} << 16;

  // Copies shape[0..ndim) elements src -> dst with conversion. `label` is
  // only evaluated into errors.
  absl::Status AddCopy(const ViewRef& src, const ViewRef& dst, const int64_t* shape, int ndim,
                       const char* label);

  // dst[i] = cast<dst>(round<acc>(sum_k float(round<acc>(inputs[k][i])))),
  // divided by the input count before the rounding for AVG: the semantics of
  // wsync::ReduceElements. Every input is contiguous row-major over `shape`,
  // all in `input_dtype`.
  absl::Status AddReduce(const void* const* inputs, int num_inputs, DType input_dtype,
                         DType accumulate_dtype, v1::ReduceOp op, const ViewRef& dst,
                         const int64_t* shape, int ndim, const char* label);

  void Clear();

  const std::vector<PieceDesc>& pieces() const { return pieces_; }
  const std::vector<TaskDesc>& tasks() const { return tasks_; }
  const std::vector<uint64_t>& inputs() const { return inputs_; }
  bool empty() const { return tasks_.empty(); }
  int64_t bytes_written() const { return bytes_written_; }
  // Every piece is a plain copy (no cast, no reduce).
  bool copy_only() const { return non_copy_pieces_ == 0; }

 private:
  // Adds `p` and its tasks.
  void Append(const PieceDesc& p);
  void AddTasks(int32_t piece_index, const PieceDesc& p);
  absl::Status AddNormalizedCopy(const char* src, DType sd, const int64_t* ss, char* dst, DType dd,
                                 const int64_t* ds, const int64_t* shape, int ndim);

  std::vector<PieceDesc> pieces_;
  std::vector<TaskDesc> tasks_;
  std::vector<uint64_t> inputs_;
  int64_t bytes_written_ = 0;
  int64_t non_copy_pieces_ = 0;
};

// In place over `ndim` dims of shape and each stride array: drops size-1 dims
// and merges dims that are contiguous in every stride array; returns the new
// ndim (>= 1), or 0 when some dim is empty.
int NormalizeDims(int64_t* shape, int ndim, int64_t** strides, int num_strides);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_PIECE_TABLE_H_
