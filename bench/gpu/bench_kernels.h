// Fill and checksum kernels for the sync benchmark's end-to-end check.
#ifndef WSYNC_BENCH_GPU_BENCH_KERNELS_H_
#define WSYNC_BENCH_GPU_BENCH_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wsync::bench {

// Rows x cols 16-bit elements, row r at p + r * row_stride elements; element
// (r, c) is number i = r * cols + c.
// Fill: element i gets a hash of (seed, i), never zero.
cudaError_t Fill16Strided(void* p, int64_t rows, int64_t cols, int64_t row_stride, uint64_t seed,
                          cudaStream_t stream);
// *sum += sum over elements v != 0 of mix(v): order-independent, so a
// resharded copy of the same elements gives the same sum (zeros, e.g. never
// written padding, count nothing). *sum must be device memory.
cudaError_t Checksum16Strided(const void* p, int64_t rows, int64_t cols, int64_t row_stride,
                              unsigned long long* sum, cudaStream_t stream);

// dst[0, bytes) = src[0, bytes) with `grid` blocks of 256 threads, 16 bytes
// per load (both 16-byte aligned, bytes a multiple of 16).
// The same over 32-bit elements (row_stride in elements): each gets a finite
// bf16 pattern in its upper half and zero below, so it casts to bf16 exactly;
// the checksum covers the upper halves (equal to a bf16 copy's checksum).
cudaError_t Fill32Strided(void* p, int64_t rows, int64_t cols, int64_t row_stride, uint64_t seed,
                          cudaStream_t stream);
cudaError_t ChecksumUpper16Strided(const void* p, int64_t rows, int64_t cols, int64_t row_stride,
                                   unsigned long long* sum, cudaStream_t stream);
cudaError_t CopySimple(void* dst, const void* src, int64_t bytes, int grid, cudaStream_t stream);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_BENCH_KERNELS_H_
