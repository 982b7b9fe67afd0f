#include "common/block_fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cast.h"

namespace wsync {

float Fp8BlockScale(float amax) {
  if (amax == 0.0f) return 1.0f;
  return amax / kFp8E4M3Max;
}

absl::Status QuantizeBlocksFp8E4M3(const float* x, const BlockGrid& g, uint8_t* q, float* scales) {
  if (g.block_rows <= 0 || g.block_cols <= 0 || g.outer < 0 || g.rows < 0 || g.cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block quantization: bad grid [", g.outer, ", ", g.rows, ", ", g.cols, "] in blocks of ",
        g.block_rows, "x", g.block_cols));
  }
  const int64_t rb = g.row_blocks(), cb = g.col_blocks();
  for (int64_t o = 0; o < g.outer; ++o) {
    const float* xo = x + o * g.rows * g.cols;
    uint8_t* qo = q + o * g.rows * g.cols;
    for (int64_t bi = 0; bi < rb; ++bi) {
      const int64_t r0 = bi * g.block_rows, r1 = std::min(g.rows, r0 + g.block_rows);
      for (int64_t bj = 0; bj < cb; ++bj) {
        const int64_t c0 = bj * g.block_cols, c1 = std::min(g.cols, c0 + g.block_cols);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            const float a = std::fabs(xo[r * g.cols + c]);
            // A NaN sticks (std::max would drop it depending on order).
            if (a > amax || std::isnan(a)) {
              if (!std::isnan(amax)) amax = a;
            }
          }
        }
        const float scale = Fp8BlockScale(amax);
        scales[(o * rb + bi) * cb + bj] = scale;
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            qo[r * g.cols + c] = FloatToFp8E4M3(xo[r * g.cols + c] / scale);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizeBlocksFp8E4M3From(const void* x, DType dtype, const BlockGrid& grid,
                                       uint8_t* q, float* scales) {
  if (!IsFloatingPoint(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("block fp8 quantization of a ",
                                                   DTypeName(dtype), " input: not a float dtype"));
  }
  if (dtype == v1::FP32) {
    return QuantizeBlocksFp8E4M3(static_cast<const float*>(x), grid, q, scales);
  }
  std::vector<float> wide(static_cast<size_t>(std::max<int64_t>(0, grid.num_elements())));
  if (absl::Status s = ConvertElements(x, dtype, wide.data(), v1::FP32, grid.num_elements());
      !s.ok()) {
    return s;
  }
  return QuantizeBlocksFp8E4M3(wide.data(), grid, q, scales);
}

}  // namespace wsync
