// The reference of DataOps::QueueWireChecksum (data_ops.h): a bucket's
// chunk_hash (common/chunk_hash.h) computed from its pieces' views, in wire
// order, with the conversions a pack would make, without packing the bucket.
// Used by the default DataOps (host memory) and by the tests of device
// implementations.
#ifndef WSYNC_WORKER_PLANE_WIRE_HASH_H_
#define WSYNC_WORKER_PLANE_WIRE_HASH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/plane/data_ops.h"

namespace wsync::exec {

// OK when `items` describe a bucket of `bucket_bytes` bytes: sorted by
// bucket_offset, disjoint, each inside [0, bucket_bytes), with a wire dtype
// and the conversions view.dtype -> via -> wire_dtype supported
// (common/cast.h). Else INVALID_ARGUMENT naming the item (ItemError).
absl::Status CheckWireHashItems(absl::Span<const WireHashItem> items, int64_t bucket_bytes);

// The wire checksum of the bucket `items` describe (data_ops.h,
// QueueWireChecksum) from host memory; checks the items first.
absl::StatusOr<uint64_t> HostWireHash(absl::Span<const WireHashItem> items, int64_t bucket_bytes);

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_PLANE_WIRE_HASH_H_
