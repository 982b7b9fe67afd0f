// Block fp8 e4m3 quantization on the GPU (common/block_fp8.h is the reference
// it matches bit for bit on finite inputs): one CTA per block reads the
// block's fp32 values from a row-major [outer, rows, cols] region, reduces
// amax, writes the scale and the fp8 elements into strided destinations.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_BLOCK_FP8_KERNEL_H_
#define WSYNC_WORKER_BACKENDS_CUDA_BLOCK_FP8_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wsync::cuda {

inline constexpr int kMaxQuantLeadDims = 6;

// One region. Leading dims (row-major, block size 1) index [rows, cols]
// matrices; destination element (o, r, c) lives at
// dst + sum_k(lead_k * dst_lead_stride[k]) + r * dst_row_stride + c * dst_col_stride
// bytes / elements as noted; scales likewise over the block grid.
struct QuantRegionDesc {
  uint64_t src = 0;    // fp32, row-major [outer, rows, cols], device
  uint64_t dst = 0;    // fp8 bytes
  uint64_t scale = 0;  // fp32
  int64_t rows = 0, cols = 0, block_rows = 0, block_cols = 0;
  int32_t nlead = 0;
  int32_t pad = 0;
  int64_t lead_shape[kMaxQuantLeadDims] = {};
  int64_t dst_lead_stride[kMaxQuantLeadDims] = {};    // elements
  int64_t scale_lead_stride[kMaxQuantLeadDims] = {};  // elements
  int64_t dst_row_stride = 0, dst_col_stride = 1;
  int64_t scale_row_stride = 0, scale_col_stride = 1;
  int64_t block_begin = 0;  // first global block index of this region
};

// regions: device array sorted by block_begin; total_blocks over all.
cudaError_t LaunchBlockFp8Quantize(const QuantRegionDesc* regions, int32_t num_regions,
                                   int64_t total_blocks, cudaStream_t stream);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_BLOCK_FP8_KERNEL_H_
