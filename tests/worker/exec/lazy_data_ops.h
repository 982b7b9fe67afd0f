// Test double with the most asynchrony DataOps and PeerWriter allow: every
// data-op call is queued and runs only when the interpreter forces it with
// Synchronize(), every put only at Fence(). Work the interpreter issues to
// overlap a transfer therefore runs as late as it possibly could on a
// device, after that transfer, so an overlap that is not safe shows up as
// wrong bytes on the host. The arithmetic is HostDataOps'. One object is both
// a channel's data ops and its peer writer (tests/worker/exec/cluster.h).
#ifndef WSYNC_TESTS_WORKER_EXEC_LAZY_DATA_OPS_H_
#define WSYNC_TESTS_WORKER_EXEC_LAZY_DATA_OPS_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

#include "common/chunk_hash.h"
#include "worker/backends/host/host_data_ops.h"
#include "worker/backends/host/host_peer_writer.h"
#include "worker/plane/wire_hash.h"

namespace wsync::exec::testing {

class LazyDataOps : public DataOps, public PeerWriter {
 public:
  std::string Name() const override { return "lazy-host"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  absl::StatusOr<StagingBuffer> AllocateStaging(int64_t bytes) override {
    return host_.AllocateStaging(bytes);
  }

  // Items are copied: callers may reuse theirs after the call returns.
  absl::Status Pack(absl::Span<const PackItem> items, void* staging_base) override {
    std::vector<PackItem> v(items.begin(), items.end());
    return Enqueue([this, v = std::move(v), staging_base] { return host_.Pack(v, staging_base); });
  }
  absl::Status Unpack(const void* staging_base, absl::Span<const UnpackItem> items) override {
    std::vector<UnpackItem> v(items.begin(), items.end());
    return Enqueue(
        [this, v = std::move(v), staging_base] { return host_.Unpack(staging_base, v); });
  }
  absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override {
    copy_handles.push_back(handle);
    std::vector<CopyItem> v(items.begin(), items.end());
    return Enqueue([this, v = std::move(v)] { return host_.Copy(v); });
  }
  absl::Status Reduce(absl::Span<const ReduceInput> inputs, absl::Span<const ReduceItem> items,
                      const void* staging_base) override {
    std::vector<ReduceInput> in(inputs.begin(), inputs.end());
    std::vector<ReduceItem> it(items.begin(), items.end());
    return Enqueue([this, in = std::move(in), it = std::move(it), staging_base] {
      return host_.Reduce(in, it, staging_base);
    });
  }
  absl::Status Synchronize() override {
    if (!queue_.empty()) ++drains_;
    return Drain(queue_);
  }
  // Checksums queue like the rest: a hash queued before its bytes are final
  // (or after they were reused) hashes the wrong bytes.
  absl::Status ResetChecksums(int64_t slots) override {
    sums_.assign(static_cast<size_t>(slots), chunk_hash::Hash(nullptr, 0));
    return absl::OkStatus();
  }
  absl::Status QueueChecksum(const void* data, int64_t bytes, int64_t slot) override {
    if (slot < 0 || slot >= static_cast<int64_t>(sums_.size())) {
      return absl::InvalidArgumentError("checksum slot out of range");
    }
    ++checksums_queued_;
    return Enqueue([this, data, bytes, slot] {
      sums_[static_cast<size_t>(slot)] = chunk_hash::Hash(data, bytes);
      return absl::OkStatus();
    });
  }
  absl::Status QueueWireChecksum(absl::Span<const WireHashItem> items, int64_t bucket_bytes,
                                 int64_t slot, ItemsHandle handle = {}) override {
    (void)handle;
    if (slot < 0 || slot >= static_cast<int64_t>(sums_.size())) {
      return absl::InvalidArgumentError("checksum slot out of range");
    }
    ++checksums_queued_;
    std::vector<WireHashItem> v(items.begin(), items.end());
    return Enqueue([this, v = std::move(v), bucket_bytes, slot]() -> absl::Status {
      auto h = HostWireHash(v, bucket_bytes);
      if (!h.ok()) return h.status();
      sums_[static_cast<size_t>(slot)] = *h;
      return absl::OkStatus();
    });
  }
  absl::StatusOr<std::vector<uint64_t>> CollectChecksums() override {
    if (absl::Status s = Synchronize(); !s.ok()) return s;
    return sums_;
  }
  int checksums_queued() const { return checksums_queued_; }
  // Puts queue apart, as on a device's put streams: Synchronize() leaves
  // them, Fence() runs only them.
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    (void)alone;
    put_handles.push_back(handle);
    std::vector<CopyItem> v(items.begin(), items.end());
    puts_.push_back([this, v = std::move(v)] { return host_.Copy(v); });
    return absl::OkStatus();
  }
  absl::Status Fence() override { return Drain(puts_); }
  absl::StatusOr<uint8_t*> TokenSlots(size_t count) override { return tokens_.TokenSlots(count); }
  absl::Status WriteToken(uint8_t* slot, uint64_t value) override {
    return tokens_.WriteToken(slot, value);
  }
  absl::StatusOr<uint64_t> ReadToken(const uint8_t* slot) override {
    return tokens_.ReadToken(slot);
  }
  // The handles of the Copy and Put calls, in call order.
  std::vector<ItemsHandle> copy_handles, put_handles;

  // Synchronize() calls that found work queued: how often the interpreter
  // made the "device" drain.
  int drains() const { return drains_; }

 private:
  using Queue = std::deque<std::function<absl::Status()>>;
  static absl::Status Drain(Queue& q) {
    absl::Status first;
    while (!q.empty()) {
      absl::Status s = q.front()();
      q.pop_front();
      if (first.ok()) first = s;
    }
    return first;
  }
  absl::Status Enqueue(std::function<absl::Status()> fn) {
    queue_.push_back(std::move(fn));
    return absl::OkStatus();
  }
  HostDataOps host_;
  HostPeerWriter tokens_;
  Queue queue_;
  Queue puts_;
  int drains_ = 0;
  std::vector<uint64_t> sums_;
  int checksums_queued_ = 0;
};

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_LAZY_DATA_OPS_H_
