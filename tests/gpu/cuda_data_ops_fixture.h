// The CUDA data ops' tests' fixture (cuda_data_ops_test.cc,
// cuda_data_ops_copy_test.cc): random strided views and a device-0 CudaDataOps
// beside the host data ops they are compared with.
#ifndef WSYNC_TESTS_GPU_CUDA_DATA_OPS_FIXTURE_H_
#define WSYNC_TESTS_GPU_CUDA_DATA_OPS_FIXTURE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/host/host_data_ops.h"

namespace wsync::cuda::testing_ops {

inline constexpr DType kFloats[] = {v1::FP32, v1::BF16, v1::FP16, v1::FP8_E4M3, v1::FP8_E5M2};

// A view described by offsets, resolved against the host or device buffer.
struct ViewSpec {
  int64_t offset = 0;
  DType dtype = v1::BF16;
  std::vector<int64_t> shape, strides;
  exec::StridedView On(void* base) const {
    return testing::View(base, offset, dtype, shape, strides);
  }
  int64_t Elements() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  // Bytes from the first to one past the last element.
  int64_t Extent() const {
    int64_t last = 0;
    for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
    return (last + 1) * DTypeSize(dtype);
  }
};

// Random strided view: a box of a random parent shape, sometimes transposed.
inline ViewSpec RandomView(std::mt19937& rng, DType dtype, int64_t max_elems) {
  ViewSpec v;
  v.dtype = dtype;
  const int nd = 1 + static_cast<int>(rng() % 3);
  std::vector<int64_t> parent(nd);
  int64_t budget = max_elems;
  for (int d = 0; d < nd; ++d) {
    v.shape.push_back(
        1 + static_cast<int64_t>(rng() % std::max<int64_t>(1, std::min<int64_t>(budget, 64))));
    budget = std::max<int64_t>(1, budget / v.shape.back());
    parent[d] = v.shape[d] + static_cast<int64_t>(rng() % 3);
  }
  std::vector<int64_t> rm(nd, 1);
  for (int d = nd - 2; d >= 0; --d) rm[d] = rm[d + 1] * parent[d + 1];
  v.strides = rm;
  if (nd >= 2 && rng() % 4 == 0) {  // column-major over the parent (a transpose)
    v.strides[0] = 1;
    for (int d = 1; d < nd; ++d) v.strides[d] = v.strides[d - 1] * parent[d - 1];
  }
  return v;
}

class CudaDataOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WSYNC_REQUIRE_GPUS(1);
    CudaDataOps::Options options;
    options.device = 0;
    auto ops = CudaDataOps::Create(options);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = std::move(*ops);
  }
  exec::HostDataOps host_;
  std::unique_ptr<CudaDataOps> ops_;
};

}  // namespace wsync::cuda::testing_ops

#endif  // WSYNC_TESTS_GPU_CUDA_DATA_OPS_FIXTURE_H_
