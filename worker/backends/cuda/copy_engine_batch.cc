#include "worker/backends/cuda/copy_engine_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "worker/backends/cuda/cuda_status.h"

namespace wsync::cuda {
namespace {

// The byte pitches of one side's outer dims as cudaMemcpy3DOperand wants
// them: row length and layer height in bytes / rows. False when the copy
// engines cannot express the side (rows overlap, or a layer is not a whole
// number of rows).
bool Pitches(const int64_t* strides, const int64_t* shape, int n, int64_t esize, size_t* row_length,
             size_t* layer_height) {
  *row_length = 0;
  *layer_height = 0;
  if (n >= 2) {
    const int64_t row = strides[n - 2] * esize;
    if (row < shape[n - 1] * esize) return false;
    *row_length = static_cast<size_t>(row);
  }
  if (n == 3) {
    if (strides[1] <= 0 || strides[0] % strides[1] != 0) return false;
    const int64_t rows = strides[0] / strides[1];
    if (rows < shape[1]) return false;
    *layer_height = static_cast<size_t>(rows);
  }
  return true;
}

cudaMemcpy3DOperand PointerOperand(const void* data, size_t row_length, size_t layer_height) {
  cudaMemcpy3DOperand op{};
  op.type = cudaMemcpyOperandTypePointer;
  op.op.ptr.ptr = const_cast<void*>(data);
  op.op.ptr.rowLength = row_length;
  op.op.ptr.layerHeight = layer_height;
  return op;
}

}  // namespace

bool CopyEngineBatch::TryAdd(const ViewRef& src, const ViewRef& dst, const int64_t* shape_in,
                             int ndim) {
  if (options_.min_bytes <= 0 || src.dtype != dst.dtype || ndim < 1 || ndim > kMaxRequestDims) {
    return false;
  }
  const int64_t esize = DTypeSize(src.dtype);
  int64_t elements = 1;
  for (int d = 0; d < ndim; ++d) elements *= shape_in[d];
  if (esize == 0 || elements * esize < options_.min_bytes) return false;
  int64_t shape[kMaxRequestDims], ss[kMaxRequestDims], ds[kMaxRequestDims];
  std::copy(shape_in, shape_in + ndim, shape);
  std::copy(src.strides, src.strides + ndim, ss);
  std::copy(dst.strides, dst.strides + ndim, ds);
  int64_t* strides[] = {ss, ds};
  const int n = NormalizeDims(shape, ndim, strides, 2);
  if (n < 1 || n > std::min(3, options_.max_dims) || ss[n - 1] != 1 || ds[n - 1] != 1) {
    return false;
  }
  if (n >= 2 && shape[n - 1] * esize < options_.min_row_bytes) return false;
  size_t src_row = 0, src_layer = 0, dst_row = 0, dst_layer = 0;
  if (!Pitches(ss, shape, n, esize, &src_row, &src_layer) ||
      !Pitches(ds, shape, n, esize, &dst_row, &dst_layer)) {
    return false;
  }
  cudaMemcpy3DBatchOp op{};
  op.src = PointerOperand(src.data, src_row, src_layer);
  op.dst = PointerOperand(dst.data, dst_row, dst_layer);
  op.extent.width = static_cast<size_t>(shape[n - 1] * esize);
  op.extent.height = n >= 2 ? static_cast<size_t>(shape[n - 2]) : 1;
  op.extent.depth = n == 3 ? static_cast<size_t>(shape[0]) : 1;
  op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  ops_.push_back(op);
  bytes_ += elements * esize;
  return true;
}

absl::Status CopyEngineBatch::Issue(cudaStream_t stream) {
  if (ops_.empty()) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy3DBatchAsync(ops_.size(), ops_.data(), 0, stream),
      absl::StrCat("copy-engine batch of ", ops_.size(), " copies (", bytes_, " bytes)"));
}

void CopyEngineBatch::Clear() {
  ops_.clear();
  bytes_ = 0;
}

}  // namespace wsync::cuda
