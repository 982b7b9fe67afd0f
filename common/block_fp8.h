// Block-scaled fp8 e4m3 quantization (DeepSeek-V3 / Kimi-K2 / vLLM "fp8
// block" checkpoints): a tensor viewed as [outer, rows, cols] is cut into
// blocks of block_rows x block_cols over (rows, cols) (blocks at the bottom /
// right edge are partial), each block gets one fp32 scale, and
//   dequantized = fp8 * scale          (vLLM's weight_scale_inv semantics)
// The arithmetic is the reference every implementation must match bit for bit:
//   amax  = max |x| over the block, in fp32 (x widened exactly from its dtype);
//   scale = amax / 448 (fp32 division, round to nearest); 1 when amax == 0;
//   q     = FloatToFp8E4M3(x / scale) (fp32 division, then round to nearest
//           even with saturation to +-448, common/cast.h).
// NaN inputs make their block's amax NaN (and every element of it NaN); an
// infinite input makes the scale infinite. Nothing clamps them: the trainer's
// weights are expected finite.
// Scales are row-major over [outer, ceil(rows / block_rows), ceil(cols / block_cols)].
#ifndef WSYNC_COMMON_BLOCK_FP8_H_
#define WSYNC_COMMON_BLOCK_FP8_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace wsync {

inline constexpr int64_t kDefaultQuantBlock = 128;
inline constexpr float kFp8E4M3Max = 448.0f;

struct BlockGrid {
  int64_t outer = 1;
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t block_rows = kDefaultQuantBlock;
  int64_t block_cols = kDefaultQuantBlock;

  int64_t row_blocks() const { return (rows + block_rows - 1) / block_rows; }
  int64_t col_blocks() const { return (cols + block_cols - 1) / block_cols; }
  int64_t num_blocks() const { return outer * row_blocks() * col_blocks(); }
  int64_t num_elements() const { return outer * rows * cols; }
};

// The scale of a block whose largest magnitude is `amax`.
float Fp8BlockScale(float amax);

// x: grid.num_elements() fp32 values, row-major [outer, rows, cols].
// q: as many e4m3 bytes, same order. scales: grid.num_blocks() floats.
// INVALID_ARGUMENT for a non-positive block or negative extents.
absl::Status QuantizeBlocksFp8E4M3(const float* x, const BlockGrid& grid, uint8_t* q,
                                   float* scales);

// Same from `n` = grid.num_elements() elements of a float dtype (bf16, fp16,
// fp32, fp8) in `dtype`, widened to fp32 first.
absl::Status QuantizeBlocksFp8E4M3From(const void* x, DType dtype, const BlockGrid& grid,
                                       uint8_t* q, float* scales);

}  // namespace wsync

#endif  // WSYNC_COMMON_BLOCK_FP8_H_
