// Session 18's wire-hash interior kernel, kept for wsync_bench_wire_hash to
// measure the production one (worker/backends/cuda/wire_hash_kernel.cu)
// against: a grid-stride loop, one 8-byte word per thread at a time, its
// item looked up in the table before each load. Raw items only (contiguous,
// unconverted): the cases the benchmark times it on.
#ifndef WSYNC_BENCH_GPU_WIRE_HASH_VARIANTS_H_
#define WSYNC_BENCH_GPU_WIRE_HASH_VARIANTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/backends/cuda/wire_hash_kernel.h"

namespace wsync::bench {

// As cuda::LaunchWireHashSum (the boundary words through it) for a table
// whose items are all raw.
cudaError_t LaunchSession18WireHashSum(const cuda::WireHashDeviceTable& table, int64_t bucket_bytes,
                                       unsigned long long* sum, cudaStream_t stream,
                                       int max_blocks);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_WIRE_HASH_VARIANTS_H_
