// The compute half of a backend: everything the op-list interpreter does to
// the memory the tensors live in (allocate staging, pack, unpack, copy,
// reduce, quantize, synchronize). Moving bytes to other workers is the
// Transport's (transport.h) or, for direct writes, the PeerWriter's
// (peer_writer.h). Implementations: HostDataOps (worker/backends/host) and
// CudaDataOps (worker/backends/cuda); tests/worker/plane/data_ops_conformance.h
// is the contract's test suite.
//
// Calls take whole lists of items so that a device implementation can batch
// thousands of small pieces into a few kernel launches: the interpreter makes
// at most one Pack, Unpack, Copy and Reduce call per round. Items are plain
// structs (no pointers to heap-owned arrays) so they can be copied to the
// device as-is; the interpreter builds them once per plan and replays them on
// every sync, so implementations must not keep pointers to them past a call.
//
// Ordering: calls on one DataOps (Pack, Unpack, Copy, Reduce, Quantize) execute
// in call order, as one ordered queue, and may be asynchronous; Synchronize()
// returns once all of them finished (and reports any deferred error). The
// interpreter calls Synchronize() before handing packed staging to the
// transport (which runs on its own stream), so before a round with transfers
// reuses a staging set. Rounds without transfers touch no staging: it queues
// their work behind the previous rounds' without waiting, relying on the call
// order alone. A PeerWriter's puts run beside this queue.
//
// Element conversions (pack / unpack / copy with differing dtypes) and the
// reduction arithmetic must match common/cast.h bit for bit.
#ifndef WSYNC_WORKER_PLANE_DATA_OPS_H_
#define WSYNC_WORKER_PLANE_DATA_OPS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/plane/transport.h"

namespace wsync::exec {

using transport::MemorySpace;

// Views are coalesced at bind time (CoalesceViews), so most pieces arrive
// with ndim 1 or 2 here.
inline constexpr int kMaxViewDims = 8;

// A strided view of resolved memory: element i (multi-index over
// shape[0..ndim)) lives at data + elem_size(dtype) * sum_d(i_d * strides[d]).
// Strides are in elements and never negative. ndim == 0 is a scalar (one
// element). Elements are enumerated row-major over `shape`: that order is the
// order of the packed bytes.
struct StridedView {
  void* data = nullptr;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  int32_t ndim = 0;
  std::array<int64_t, kMaxViewDims> shape{};
  std::array<int64_t, kMaxViewDims> strides{};

  int64_t num_elements() const;
  // ndim <= 1 with unit stride (or any view of <= 1 element).
  bool contiguous() const;
};

// src (strided) -> staging_base + staging_offset (contiguous, row-major over
// src.shape), converted from src.dtype to wire_dtype.
struct PackItem {
  StridedView src;
  int64_t staging_offset = 0;
  DType wire_dtype = v1::DTYPE_UNSPECIFIED;
  // Block fp8 at the sender (quant_block_rows > 0, wire_dtype FP8_E4M3):
  // src's elements, read row-major and laid out as [quant_outer, quant_rows,
  // quant_cols], are quantized in blocks (common/block_fp8.h); the fp8 bytes
  // go to staging_offset, the fp32 scales to scale_offset.
  int64_t quant_outer = 0;
  int64_t quant_rows = 0;
  int64_t quant_cols = 0;
  int64_t quant_block_rows = 0;
  int64_t quant_block_cols = 0;
  int64_t scale_offset = 0;
};

// staging_base + staging_offset (contiguous, wire_dtype, dst.num_elements()
// elements) -> dst (strided), converted to dst.dtype.
struct UnpackItem {
  int64_t staging_offset = 0;
  DType wire_dtype = v1::DTYPE_UNSPECIFIED;
  StridedView dst;
};

// src -> dst with conversion; src and dst have the same ndim and shape
// (coalesced together).
struct CopyItem {
  StridedView src;
  StridedView dst;
};

// One reduce input: either a strided view (staging_offset < 0), or packed
// bytes at staging_base + staging_offset, contiguous in view.dtype with
// view.shape (view.data is then ignored).
struct ReduceInput {
  StridedView view;
  int64_t staging_offset = -1;
};

// dst = op over inputs[input_begin, input_begin + num_inputs): each input is
// converted to accumulate_dtype, combined with ReduceElements semantics
// (fp32 accumulation in input order, one rounding to accumulate_dtype), then
// converted to dst.dtype. Strided inputs have dst's ndim and shape (coalesced
// together with dst); staged inputs have dst's element count.
struct ReduceItem {
  v1::ReduceOp op = v1::REDUCE_SUM;
  DType accumulate_dtype = v1::DTYPE_UNSPECIFIED;
  StridedView dst;
  int32_t input_begin = 0;
  int32_t num_inputs = 0;
};

// One part of a block fp8 quantization: its elements, read row-major from
// `view` (strided, staging_offset < 0) or from packed bytes at staging_base +
// staging_offset (contiguous in view.dtype, view.num_elements() elements),
// fill the box [offset, offset + shape) of the item's region.
struct QuantizeInput {
  StridedView view;
  int64_t staging_offset = -1;
  std::array<int64_t, kMaxViewDims> offset{};
  std::array<int64_t, kMaxViewDims> shape{};  // dst.ndim dims
};

// The region `dst` (FP8_E4M3, ndim >= 2, not coalesced: blocks cut its last
// two dims) is assembled from inputs[input_begin, input_begin + num_inputs),
// which tile it, and quantized block by block (common/block_fp8.h): fp8 into
// dst, the scales (row-major over [outer, row blocks, col blocks]) into
// scale_dst.
struct QuantizeItem {
  StridedView dst;
  StridedView scale_dst;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  int32_t input_begin = 0;
  int32_t num_inputs = 0;
};

// One piece of a bucket hashed from its views instead of a packed copy
// (DataOps::QueueWireChecksum): the buckets of direct writes, which are
// never packed. Its elements, read row-major from `view` (this worker's
// memory), converted view.dtype -> via (where set) -> wire_dtype
// (common/cast.h), are the bucket's bytes from bucket_offset on.
struct WireHashItem {
  StridedView view;
  DType via = v1::DTYPE_UNSPECIFIED;
  DType wire_dtype = v1::DTYPE_UNSPECIFIED;
  int64_t bucket_offset = 0;
};

// Move-only owner of one staging allocation; frees it on destruction.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(void* data, int64_t bytes, std::function<void(void*)> free_fn)
      : data_(data), bytes_(bytes), free_(std::move(free_fn)) {}
  StagingBuffer(StagingBuffer&& other) noexcept { *this = std::move(other); }
  StagingBuffer& operator=(StagingBuffer&& other) noexcept;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() { Reset(); }

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  void Reset();

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  std::function<void(void*)> free_;
};

// A raw view of `shape` / `strides` (elements) at `data`. An empty shape is a
// scalar (stored as shape {1}). INVALID_ARGUMENT for negative sizes or
// strides, mismatched ranks, or more than kMaxViewDims dims.
absl::StatusOr<StridedView> MakeStridedView(void* data, DType dtype,
                                            absl::Span<const int64_t> shape,
                                            absl::Span<const int64_t> strides);

// Coalesces views of one common shape together, keeping the shapes equal:
// size-1 dims are dropped and dim d is merged into d+1 where every view steps
// over the whole of d+1 (strides[d] == shape[d+1] * strides[d+1]). An empty
// view becomes shape {0}. With one view, that view alone is coalesced.
// Precondition: equal ndim and shape (the binder checks).
void CoalesceViews(absl::Span<StridedView* const> views);

// A data-op error about one item of a call: "<what> item <index>: <s>", with
// the index also attached as a payload, so the interpreter can name the
// tensor the item came from without parsing the message.
absl::Status ItemError(const absl::Status& s, const char* what, size_t index);
// Attaches only the payload (for messages that already name the item).
absl::Status TagItem(absl::Status s, size_t index);
// The item index ItemError attached, or -1.
int64_t ErrorItemIndex(const absl::Status& s);

// A prepared item list (DataOps::Prepare, PeerWriter::Prepare): names one
// list for the calls given it, so an implementation may key what it derived
// from the list (a device's resident tables) by the handle instead of
// reading every item again. id 0 is "not prepared".
struct ItemsHandle {
  uint64_t id = 0;
};

class DataOps {
 public:
  virtual ~DataOps() = default;

  virtual std::string Name() const = 0;
  // Where staging lives and which registered buffers these ops can touch.
  virtual MemorySpace memory_space() const = 0;

  // At least `bytes` bytes, aligned to 256 bytes. 0 bytes gives an empty
  // buffer (data() may be null). RESOURCE_EXHAUSTED when memory is short.
  virtual absl::StatusOr<StagingBuffer> AllocateStaging(int64_t bytes) = 0;

  virtual absl::Status Pack(absl::Span<const PackItem> items, void* staging_base) = 0;
  virtual absl::Status Unpack(const void* staging_base, absl::Span<const UnpackItem> items) = 0;
  // Prepares `items` for repeated Copy calls: the returned handle (unique
  // within this instance, never id 0) may be passed with exactly that list,
  // unchanged, to every later Copy. Cheap: an implementation keys what it
  // derives on the first call given the handle.
  virtual ItemsHandle Prepare(absl::Span<const CopyItem> items);
  // `handle`: from Prepare(items), or {} (then nothing is keyed by it). The
  // effect is the same either way.
  virtual absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) = 0;
  // staging_base resolves inputs with staging_offset >= 0 (may be null if none
  // has one).
  virtual absl::Status Reduce(absl::Span<const ReduceInput> inputs,
                              absl::Span<const ReduceItem> items, const void* staging_base) = 0;
  // Waits for every call issued so far and reports the first deferred error
  // (naming its item, as ItemError does). Also the point where memory the
  // calls outgrew may be freed: never called while a transfer is in flight.
  virtual absl::Status Synchronize() = 0;
  // Block fp8 quantization at the receiver (and local quantizing copies).
  // Implementations without it refuse plans that need it.
  // The chunk_hash::Hash (common/chunk_hash.h) of `bytes` bytes at `data`
  // (memory of this space), once every call issued so far finished. The
  // default synchronizes and hashes on the CPU: host memory only.
  virtual absl::StatusOr<uint64_t> Checksum(const void* data, int64_t bytes);
  // The same hash, queued: ResetChecksums(n) makes slots 0..n-1 empty;
  // QueueChecksum hashes `bytes` at `data` into `slot` in the order of the
  // calls above (on a device: behind the work already queued, without
  // waiting; the memory must stay unchanged until it ran); CollectChecksums
  // waits for everything issued and returns each slot's hash (a slot never
  // queued hashes 0 bytes). The default hashes at once on the CPU (host
  // memory only). INVALID_ARGUMENT for a slot out of range.
  virtual absl::Status ResetChecksums(int64_t slots);
  virtual absl::Status QueueChecksum(const void* data, int64_t bytes, int64_t slot);
  virtual absl::StatusOr<std::vector<uint64_t>> CollectChecksums();
  // A bucket's checksum from its pieces' views, queued like QueueChecksum:
  // the chunk_hash::Hash of the `bucket_bytes`-byte image that holds every
  // item's wire bytes (WireHashItem) at its bucket_offset and zero bytes
  // wherever no item lies. That is the hash of the packed bucket
  // (QueueChecksum over the staging a pack filled) wherever the pieces tile
  // it without gaps. Items must be sorted by bucket_offset, disjoint, inside
  // the bucket and convertible (CheckWireHashItems; INVALID_ARGUMENT naming
  // the item). The views must stay unchanged until the hash ran. `handle`:
  // from PrepareWireHash(items) or {}, as for Copy. The default hashes at
  // once on the CPU (host memory only, HostWireHash).
  virtual ItemsHandle PrepareWireHash(absl::Span<const WireHashItem> items);
  virtual absl::Status QueueWireChecksum(absl::Span<const WireHashItem> items, int64_t bucket_bytes,
                                         int64_t slot, ItemsHandle handle = {});
  // Makes the calls issued after this one wait, on the device, until `mark`
  // (a transport's RoundHooks::on_landed) is reached; the caller does not
  // block. The default takes only the host's null mark (the bytes are in
  // memory already) and refuses any other with FAILED_PRECONDITION.
  virtual absl::Status WaitForLanding(const transport::LandingMark& mark);
  // Shadow copies of staged syncs (docs/staging.md): `bytes` (>= 0) of host
  // memory the calls above can read and write (pinned on a device), freed
  // when the buffer goes. The default: AllocateStaging on host ops,
  // UNIMPLEMENTED on others.
  virtual absl::StatusOr<StagingBuffer> AllocateHostShadow(int64_t bytes);
  virtual absl::Status Quantize(absl::Span<const QuantizeInput> inputs,
                                absl::Span<const QuantizeItem> items, const void* staging_base) {
    (void)inputs;
    (void)staging_base;
    if (items.empty()) return absl::OkStatus();
    return absl::UnimplementedError(
        absl::StrCat(Name(), " data ops cannot block-quantize (block fp8 destinations)"));
  }

 private:
  uint64_t next_handle_ = 0;
  std::vector<uint64_t> checksum_slots_;  // the default Queue/CollectChecksums
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_PLANE_DATA_OPS_H_
