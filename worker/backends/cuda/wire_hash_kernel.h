// The GPU side of DataOps::QueueWireChecksum (worker/plane/data_ops.h): a
// bucket's chunk_hash sum computed from its pieces' views, in wire order,
// converting as the pack would (bit for bit as common/cast.h), without
// packing the bucket. Every word of the bucket is one of:
//   * interior: inside one item: one thread reads it (an 8-byte load when
//     the item is contiguous, unconverted and 8-byte aligned, else its
//     elements one by one);
//   * boundary: shared by items and / or gaps: one thread gathers its bytes
//     from the items it meets (binary search by offset);
//   * zero: in a gap: summed once on the host (WireHashTable::zero_sum).
// Both kernels add into one uint64 sum (mod 2^64) per bucket; the caller
// finishes with chunk_hash::Finish(sum + zero_sum, bucket_bytes), equal to
// exec::HostWireHash (tests/worker/plane/data_ops_conformance.h).
#ifndef WSYNC_WORKER_BACKENDS_CUDA_WIRE_HASH_KERNEL_H_
#define WSYNC_WORKER_BACKENDS_CUDA_WIRE_HASH_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace wsync::cuda {

inline constexpr int kWireHashMaxDims = 8;

// One item as the kernels read it (plain data, copied to the device).
struct WireHashDesc {
  const unsigned char* data = nullptr;
  int64_t offset = 0;  // bucket offset of its first wire byte
  int64_t bytes = 0;   // wire bytes
  int64_t shape[kWireHashMaxDims] = {};
  int64_t strides[kWireHashMaxDims] = {};  // elements
  int32_t ndim = 1;
  int32_t src_dtype = 0;  // wsync.v1.DType values
  int32_t via_dtype = 0;  // src_dtype when no intermediate conversion
  int32_t wire_dtype = 0;
  int32_t src_size = 0;
  int32_t wire_size = 0;
  int32_t raw = 0;  // contiguous and unconverted: the wire bytes are the memory
};

// A bucket's table, built on the host once per prepared list: the items,
// then (int64) each item's first interior word and the running count of
// interior words before it (items + 1 entries), then the boundary words.
struct WireHashTable {
  std::vector<WireHashDesc> items;
  std::vector<int64_t> first_word;
  std::vector<int64_t> interior_before;  // items.size() + 1
  std::vector<int64_t> boundary_words;
  uint64_t zero_sum = 0;  // terms of the words wholly in gaps
};
// Builds `items`' table for a bucket of `bucket_bytes` bytes (items sorted
// and checked: exec::CheckWireHashItems).
WireHashTable BuildWireHashTable(std::vector<WireHashDesc> items, int64_t bucket_bytes);

// Device pointers into one uploaded table (the layout above).
struct WireHashDeviceTable {
  const WireHashDesc* items = nullptr;
  const int64_t* first_word = nullptr;
  const int64_t* interior_before = nullptr;
  const int64_t* boundary_words = nullptr;
  int64_t num_items = 0;
  int64_t num_boundary = 0;
  int64_t interior_words = 0;
};

// Adds the bucket's interior and boundary terms into *sum on `stream`;
// `max_blocks` bounds the grid.
cudaError_t LaunchWireHashSum(const WireHashDeviceTable& table, int64_t bucket_bytes,
                              unsigned long long* sum, cudaStream_t stream, int max_blocks);

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_WIRE_HASH_KERNEL_H_
