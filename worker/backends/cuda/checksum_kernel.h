// The GPU twin of common/chunk_hash.h: a grid-stride loop over the range's
// 8-byte words (consecutive threads read consecutive words: coalesced), each
// thread summing Term(w, k) of its words, warps and blocks reducing, one
// atomicAdd per block into *sum (mod 2^64, as on the host). The caller
// finishes with chunk_hash::Finish(sum, bytes), equal to chunk_hash::Hash on
// the host bit for bit (tests/gpu/checksum_kernel_test.cc).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CHECKSUM_KERNEL_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CHECKSUM_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wsync::cuda {

// `data`: `bytes` bytes of device (or mapped pinned) memory, any alignment;
// `sum`: one device uint64 the kernel adds into (zero it first, on `stream`).
// `max_blocks` bounds the grid (0: one block per 256 threads' words).
cudaError_t LaunchChunkHashSum(const void* data, int64_t bytes, unsigned long long* sum,
                               cudaStream_t stream, int max_blocks = 0);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CHECKSUM_KERNEL_H_
