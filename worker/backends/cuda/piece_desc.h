// Plain-old-data descriptors shared by the host table builder (piece_table.cc)
// and the batched kernel (piece_kernels.cu). One PieceDesc is one strided
// region copied (with a cast) or reduced; TaskDescs cut pieces into blocks of
// bounded size so that one launch balances thousands of pieces of any size.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_PIECE_DESC_H_
#define WSYNC_WORKER_BACKENDS_CUDA_PIECE_DESC_H_

#include <cstdint>

namespace wsync::cuda {

// Views are normalized to at most this many dims (outer three = rows).
inline constexpr int kMaxPieceDims = 4;

enum PieceMode : int32_t {
  kModeVecCopy = 0,   // same dtype, 16-byte aligned rows: int4 loads/stores
  kModeRawCopy = 1,   // same dtype, any alignment: element-size copies
  kModeCastCopy = 2,  // float dtype conversion through fp32
  kModeReduce = 3,    // sum (or average) of several contiguous inputs
};

// Dtype codes are the wsync.v1.DType enum values.
struct PieceDesc {
  uint64_t src = 0;  // copy: source base; reduce: first index into the input table
  uint64_t dst = 0;
  int64_t shape[kMaxPieceDims] = {1, 1, 1, 1};
  int64_t src_stride[kMaxPieceDims] = {0, 0, 0, 1};  // elements
  int64_t dst_stride[kMaxPieceDims] = {0, 0, 0, 1};
  int32_t mode = kModeRawCopy;
  int32_t src_dtype = 0;
  int32_t dst_dtype = 0;
  int32_t acc_dtype = 0;   // reduce: the dtype the sum is rounded to before the cast
  int32_t num_inputs = 0;  // reduce
  int32_t average = 0;     // reduce: divide by num_inputs
  int32_t src_esize = 0;
  int32_t dst_esize = 0;
};

// Rows [row0, row0 + nrows) x columns [col0, col0 + ncols) of one piece, in
// elements; rows index the outer three dims row-major.
struct TaskDesc {
  int64_t row0 = 0;
  int64_t nrows = 0;
  int64_t col0 = 0;
  int64_t ncols = 0;
  int32_t piece = 0;
  int32_t pad = 0;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_PIECE_DESC_H_
