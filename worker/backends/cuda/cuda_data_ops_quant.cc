// CudaDataOps' block fp8 paths: quantizing packs and receiver-side (or local)
// quantization, each a piece-kernel gather into fp32 scratch followed by one
// quantization launch (worker/backends/cuda/block_fp8_kernel.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_data_ops_internal.h"
#include "worker/backends/cuda/cuda_status.h"

namespace wsync::cuda {

using data_ops_internal::Annotate;
using data_ops_internal::CheckPackItem;
using data_ops_internal::CheckView;
using data_ops_internal::RowMajor;
using exec::StridedView;

absl::Status CudaDataOps::LaunchQuant(const std::vector<QuantRegionDesc>& regions, int64_t blocks) {
  if (regions.empty() || blocks == 0) return absl::OkStatus();
  const size_t bytes = regions.size() * sizeof(QuantRegionDesc);
  if (bytes > quant_regions_.size()) {
    // The last launch may still read it: retired, not freed.
    retired_.Retire(std::move(quant_regions_));
    ASSIGN_OR_RETURN(quant_regions_, DeviceBuffer::Allocate(device_, bytes));
  }
  // Stream-ordered after the previous launch that read the table.
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(quant_regions_.data(), regions.data(), bytes,
                                             cudaMemcpyHostToDevice, stream_.get()),
                             "upload of block fp8 regions"));
  return CudaStatus(
      LaunchBlockFp8Quantize(static_cast<const QuantRegionDesc*>(quant_regions_.data()),
                             static_cast<int32_t>(regions.size()), blocks, stream_.get()),
      "block fp8 quantization launch");
}

absl::Status CudaDataOps::PackQuantized(absl::Span<const exec::PackItem> items,
                                        void* staging_base) {
  table_.Clear();
  int64_t need = 0;
  for (const exec::PackItem& it : items) {
    if (it.quant_block_rows > 0) need += (it.src.num_elements() * 4 + 255) / 256 * 256;
  }
  RETURN_IF_ERROR(ReserveScratch(need));
  std::vector<QuantRegionDesc> regions;
  int64_t blocks = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::PackItem& it = items[i];
    RETURN_IF_ERROR(CheckPackItem(it, staging_base, i));
    const int64_t n = it.src.num_elements();
    if (n == 0) continue;
    char* const stage = static_cast<char*>(staging_base);
    if (it.quant_block_rows <= 0) {
      RETURN_IF_ERROR(AddPackRequest(it, staging_base, i));
      continue;
    }
    if (it.wire_dtype != v1::FP8_E4M3 || it.quant_block_cols <= 0 ||
        it.quant_outer * it.quant_rows * it.quant_cols != n) {
      return Annotate(absl::InvalidArgumentError(
                          "quantized pack needs wire FP8_E4M3, positive blocks and a grid of "
                          "the source's element count"),
                      "pack", i);
    }
    ASSIGN_OR_RETURN(char* tmp, Scratch(n * 4));
    StridedView conv = it.src;  // contiguous fp32, the source's shape
    conv.data = tmp;
    conv.dtype = v1::FP32;
    RowMajor(conv.shape.data(), conv.ndim, conv.strides.data());
    RETURN_IF_ERROR(AddCopyItem(it.src, conv, "quantized pack", i));
    QuantRegionDesc q;
    q.src = reinterpret_cast<uint64_t>(tmp);
    q.dst = reinterpret_cast<uint64_t>(stage + it.staging_offset);
    q.scale = reinterpret_cast<uint64_t>(stage + it.scale_offset);
    q.rows = it.quant_rows;
    q.cols = it.quant_cols;
    q.block_rows = it.quant_block_rows;
    q.block_cols = it.quant_block_cols;
    const int64_t rb = (q.rows + q.block_rows - 1) / q.block_rows;
    const int64_t cb = (q.cols + q.block_cols - 1) / q.block_cols;
    q.nlead = 1;
    q.lead_shape[0] = it.quant_outer;
    q.dst_lead_stride[0] = q.rows * q.cols;
    q.scale_lead_stride[0] = rb * cb;
    q.dst_row_stride = q.cols;
    q.scale_row_stride = cb;
    q.block_begin = blocks;
    blocks += it.quant_outer * rb * cb;
    regions.push_back(q);
  }
  RETURN_IF_ERROR(Run(std::string()));
  return LaunchQuant(regions, blocks);
}

absl::Status CudaDataOps::Quantize(absl::Span<const exec::QuantizeInput> inputs,
                                   absl::Span<const exec::QuantizeItem> items,
                                   const void* staging_base) {
  table_.Clear();
  int64_t need = 0;
  for (const exec::QuantizeItem& q : items) need += (q.dst.num_elements() * 4 + 255) / 256 * 256;
  RETURN_IF_ERROR(ReserveScratch(need));
  std::vector<QuantRegionDesc> regions;
  int64_t blocks = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::QuantizeItem& it = items[i];
    const int nd = it.dst.ndim;
    if (it.dst.dtype != v1::FP8_E4M3 || it.scale_dst.dtype != v1::FP32 || nd < 2 ||
        nd - 2 > kMaxQuantLeadDims || it.scale_dst.ndim != nd || it.block_rows <= 0 ||
        it.block_cols <= 0 || it.input_begin < 0 || it.num_inputs < 0 ||
        static_cast<size_t>(it.input_begin) + it.num_inputs > inputs.size()) {
      return Annotate(absl::InvalidArgumentError(
                          "needs an FP8_E4M3 region of 2..8 dims, FP32 scales of its rank, "
                          "positive blocks and inputs in range"),
                      "quantize", i);
    }
    RETURN_IF_ERROR(Annotate(CheckView(it.dst, "quantize destination"), "quantize", i));
    RETURN_IF_ERROR(Annotate(CheckView(it.scale_dst, "quantize scales"), "quantize", i));
    const int64_t rows = it.dst.shape[nd - 2], cols = it.dst.shape[nd - 1];
    const int64_t rb = (rows + it.block_rows - 1) / it.block_rows;
    const int64_t cb = (cols + it.block_cols - 1) / it.block_cols;
    int64_t outer = 1;
    for (int d = 0; d + 2 < nd; ++d) outer *= it.dst.shape[d];
    if (it.scale_dst.num_elements() != outer * rb * cb) {
      return Annotate(absl::InvalidArgumentError("scale view is not the region's block grid"),
                      "quantize", i);
    }
    const int64_t n = it.dst.num_elements();
    if (n == 0) continue;
    ASSIGN_OR_RETURN(char* tmp, Scratch(n * 4));
    int64_t filled = 0;
    for (int32_t k = it.input_begin; k < it.input_begin + it.num_inputs; ++k) {
      const exec::QuantizeInput& in = inputs[k];
      StridedView v = in.view;
      if (in.staging_offset >= 0) {
        if (staging_base == nullptr) {
          return Annotate(absl::InvalidArgumentError("staged input but null staging"), "quantize",
                          i);
        }
        v.data = const_cast<char*>(static_cast<const char*>(staging_base)) + in.staging_offset;
        const int64_t m = in.view.num_elements();
        v.ndim = 1;
        v.shape[0] = m;
        v.strides[0] = 1;
      }
      StridedView place;  // the input's box in the row-major fp32 region
      place.dtype = v1::FP32;
      place.ndim = nd;
      int64_t stride = 1, first = 0, m = 1;
      for (int d = nd - 1; d >= 0; --d) {
        if (in.offset[d] < 0 || in.offset[d] + in.shape[d] > it.dst.shape[d]) {
          return Annotate(absl::InvalidArgumentError(absl::StrCat("input ", k, " lies outside")),
                          "quantize", i);
        }
        place.shape[d] = in.shape[d];
        place.strides[d] = stride;
        first += in.offset[d] * stride;
        stride *= it.dst.shape[d];
        m *= in.shape[d];
      }
      if (m != v.num_elements()) {
        return Annotate(absl::InvalidArgumentError(absl::StrCat(
                            "input ", k, " has ", v.num_elements(), " elements for a box of ", m)),
                        "quantize", i);
      }
      RETURN_IF_ERROR(Annotate(CheckView(v, "quantize input"), "quantize", i));
      place.data = tmp + 4 * first;
      filled += m;
      if (m > 0) RETURN_IF_ERROR(AddCopyItem(v, place, "quantize input of", i));
    }
    if (filled != n) {
      return Annotate(
          absl::InvalidArgumentError(absl::StrCat("inputs fill ", filled, " of ", n, " elements")),
          "quantize", i);
    }
    QuantRegionDesc q;
    q.src = reinterpret_cast<uint64_t>(tmp);
    q.dst = reinterpret_cast<uint64_t>(it.dst.data);
    q.scale = reinterpret_cast<uint64_t>(it.scale_dst.data);
    q.rows = rows;
    q.cols = cols;
    q.block_rows = it.block_rows;
    q.block_cols = it.block_cols;
    q.nlead = nd - 2;
    for (int d = 0; d + 2 < nd; ++d) {
      q.lead_shape[d] = it.dst.shape[d];
      q.dst_lead_stride[d] = it.dst.strides[d];
      q.scale_lead_stride[d] = it.scale_dst.strides[d];
    }
    q.dst_row_stride = it.dst.strides[nd - 2];
    q.dst_col_stride = it.dst.strides[nd - 1];
    q.scale_row_stride = it.scale_dst.strides[nd - 2];
    q.scale_col_stride = it.scale_dst.strides[nd - 1];
    q.block_begin = blocks;
    blocks += outer * rb * cb;
    regions.push_back(q);
  }
  RETURN_IF_ERROR(Run(std::string()));
  return LaunchQuant(regions, blocks);
}

}  // namespace wsync::cuda
