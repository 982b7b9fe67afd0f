// Memory for the interface suites (data_ops_conformance.h,
// peer_writer_conformance.h): where a backend's buffers live, and copies
// between it and host memory. Defaults: host memory.
#ifndef WSYNC_TESTS_WORKER_PLANE_PLANE_TEST_MEMORY_H_
#define WSYNC_TESTS_WORKER_PLANE_PLANE_TEST_MEMORY_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/cast.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "worker/plane/data_ops.h"

namespace wsync::plane::conformance {

class TestMemory {
 public:
  virtual ~TestMemory() = default;
  // Why this machine cannot run the suite (the test is skipped), or "".
  virtual std::string Unavailable() { return ""; }
  // `bytes` bytes (at least one) the backend's calls can touch.
  virtual std::shared_ptr<uint8_t> Allocate(size_t bytes) {
    return std::shared_ptr<uint8_t>(new uint8_t[bytes == 0 ? 1 : bytes],
                                    std::default_delete<uint8_t[]>());
  }
  virtual void Write(void* dst, const void* host, size_t bytes) { std::memcpy(dst, host, bytes); }
  virtual void Read(void* host, const void* src, size_t bytes) { std::memcpy(host, src, bytes); }

  // `p` (at least host.size() bytes) once `host`'s bytes are written into it.
  std::shared_ptr<uint8_t> Filled(std::shared_ptr<uint8_t> p, const std::vector<uint8_t>& host) {
    Write(p.get(), host.data(), host.size());
    return p;
  }
  // Memory from Allocate holding `host`'s bytes.
  std::shared_ptr<uint8_t> Upload(const std::vector<uint8_t>& host) {
    return Filled(Allocate(host.size()), host);
  }
  // `bytes` bytes at `p`, read back into host memory.
  std::vector<uint8_t> Download(const void* p, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    Read(host.data(), p, bytes);
    return host;
  }
};

// `n` fp32 values: random normals of either sign and magnitudes from 1e-3 to
// 1e3, with signed zeros, fp32 subnormals and values past fp16's range mixed
// in (casts must round them exactly as common/cast.h does).
inline std::vector<float> TestFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(-3.0f, 3.0f);
  std::vector<float> v(n);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 70000.0f, -1e6f, 448.0f, 1.0f / 3};
  for (size_t i = 0; i < n; ++i) {
    if (i % 11 == 3) {
      v[i] = specials[(i / 11) % (sizeof(specials) / sizeof(float))];
    } else {
      v[i] = std::pow(10.0f, mag(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    }
  }
  return v;
}

// `values` converted to `dtype` by common/cast.h.
inline std::vector<uint8_t> CastFrom(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  const absl::Status s = ConvertElements(values.data(), v1::FP32, out.data(), dtype,
                                         static_cast<int64_t>(values.size()));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// A 2-D view over `data`: [rows, cols] with the given element strides.
inline exec::StridedView View2D(void* data, DType dtype, int64_t rows, int64_t cols,
                                int64_t row_stride, int64_t col_stride) {
  auto v = exec::MakeStridedView(data, dtype, {rows, cols}, {row_stride, col_stride});
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : exec::StridedView();
}

// Element (r, c) of a row-major [rows, cols] host array of `esize`-byte
// elements laid out with the given strides.
inline const uint8_t* At(const std::vector<uint8_t>& bytes, int64_t esize, int64_t r, int64_t c,
                         int64_t row_stride, int64_t col_stride) {
  return bytes.data() + (r * row_stride + c * col_stride) * esize;
}

}  // namespace wsync::plane::conformance

#endif  // WSYNC_TESTS_WORKER_PLANE_PLANE_TEST_MEMORY_H_
