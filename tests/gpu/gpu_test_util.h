// Helpers shared by the GPU tests: host/device twin buffers, so one builder
// produces the same items for HostDataOps (reference) and CudaDataOps.
#ifndef WSYNC_TESTS_GPU_GPU_TEST_UTIL_H_
#define WSYNC_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "worker/backends/cuda/cuda_handles.h"
#include "worker/plane/data_ops.h"

namespace wsync::testing {

// Skips the current test unless at least `n` GPUs are visible.
#define WSYNC_REQUIRE_GPUS(n)                                                   \
  do {                                                                          \
    auto count = ::wsync::cuda::DeviceCount();                                  \
    if (!count.ok() || *count < (n)) {                                          \
      GTEST_SKIP() << "needs " << (n) << " GPU(s); "                            \
                   << (count.ok() ? std::to_string(*count) + " visible"         \
                                  : std::string(count.status().message()));     \
    }                                                                           \
  } while (0)

// The same bytes on the host and on one GPU.
class TwinBuffer {
 public:
  TwinBuffer(int device, size_t bytes, uint32_t seed) : host_(bytes) {
    std::mt19937 rng(seed);
    for (auto& b : host_) b = static_cast<uint8_t>(rng());
    auto dev = cuda::DeviceBuffer::Allocate(device, bytes);
    EXPECT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    Upload();
  }
  // cudaMemcpy from pageable memory may return before the DMA reached the
  // device; kernels on non-blocking streams would race it: wait for it.
  void Upload() {
    ASSERT_EQ(cudaMemcpy(dev_.data(), host_.data(), host_.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(host_.size());
    EXPECT_EQ(cudaMemcpy(out.data(), dev_.data(), out.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }
  uint8_t* host() { return host_.data(); }
  void* dev() const { return dev_.data(); }
  std::vector<uint8_t>& host_bytes() { return host_; }
  size_t size() const { return host_.size(); }

 private:
  std::vector<uint8_t> host_;
  cuda::DeviceBuffer dev_;
};

inline exec::StridedView View(void* base, int64_t byte_offset, DType dtype,
                              std::vector<int64_t> shape, std::vector<int64_t> strides) {
  exec::StridedView v;
  v.data = static_cast<char*>(base) + byte_offset;
  v.dtype = dtype;
  v.ndim = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  return v;
}

// First differing byte, or -1.
inline int64_t FirstDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace wsync::testing

#endif  // WSYNC_TESTS_GPU_GPU_TEST_UTIL_H_
