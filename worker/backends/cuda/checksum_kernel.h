// The GPU twin of common/chunk_hash.h: one thread per 4 KiB chunk computes
// the chunk's term (the same ChunkHash / ChunkTerm code, compiled for the
// device), terms are summed mod 2^64 per block and then atomically into
// *sum. The caller finishes with chunk_hash::Finish(sum, bytes), so the
// result equals chunk_hash::Hash on the host bit for bit.
// UNTESTED ON A GPU (written without one): tests/gpu/checksum_kernel_test.cc
// compares it with the host hash; run it with scripts/gpu_run.sh.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CHECKSUM_KERNEL_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CHECKSUM_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wsync::cuda {

// `data`: `bytes` bytes of device (or mapped pinned) memory; `sum`: one
// device uint64 the kernel adds into (zero it first, on `stream`).
cudaError_t LaunchChunkHashSum(const void* data, int64_t bytes, unsigned long long* sum,
                               cudaStream_t stream);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CHECKSUM_KERNEL_H_
