// Channel parts a test owns and inspects, lent to a DataPlane channel (which
// owns its parts): every call goes to the test's object.
#ifndef WSYNC_TESTS_WORKER_EXEC_BORROWED_PLANE_H_
#define WSYNC_TESTS_WORKER_EXEC_BORROWED_PLANE_H_

#include <string>
#include <vector>

#include "worker/plane/data_ops.h"
#include "worker/plane/peer_writer.h"

namespace wsync::exec::testing {

class BorrowedDataOps : public DataOps {
 public:
  explicit BorrowedDataOps(DataOps* ops) : ops_(ops) {}
  std::string Name() const override { return ops_->Name(); }
  MemorySpace memory_space() const override { return ops_->memory_space(); }
  absl::StatusOr<StagingBuffer> AllocateStaging(int64_t bytes) override {
    return ops_->AllocateStaging(bytes);
  }
  absl::Status Pack(absl::Span<const PackItem> items, void* staging_base) override {
    return ops_->Pack(items, staging_base);
  }
  absl::Status Unpack(const void* staging_base, absl::Span<const UnpackItem> items) override {
    return ops_->Unpack(staging_base, items);
  }
  ItemsHandle Prepare(absl::Span<const CopyItem> items) override { return ops_->Prepare(items); }
  absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override {
    return ops_->Copy(items, handle);
  }
  absl::Status Reduce(absl::Span<const ReduceInput> inputs, absl::Span<const ReduceItem> items,
                      const void* staging_base) override {
    return ops_->Reduce(inputs, items, staging_base);
  }
  absl::Status Synchronize() override { return ops_->Synchronize(); }
  absl::Status Quantize(absl::Span<const QuantizeInput> inputs,
                        absl::Span<const QuantizeItem> items, const void* staging_base) override {
    return ops_->Quantize(inputs, items, staging_base);
  }
  absl::StatusOr<uint64_t> Checksum(const void* data, int64_t bytes) override {
    return ops_->Checksum(data, bytes);
  }
  absl::Status ResetChecksums(int64_t slots) override { return ops_->ResetChecksums(slots); }
  absl::Status QueueChecksum(const void* data, int64_t bytes, int64_t slot) override {
    return ops_->QueueChecksum(data, bytes, slot);
  }
  absl::StatusOr<std::vector<uint64_t>> CollectChecksums() override {
    return ops_->CollectChecksums();
  }
  ItemsHandle PrepareWireHash(absl::Span<const WireHashItem> items) override {
    return ops_->PrepareWireHash(items);
  }
  absl::Status QueueWireChecksum(absl::Span<const WireHashItem> items, int64_t bucket_bytes,
                                 int64_t slot, ItemsHandle handle = {}) override {
    return ops_->QueueWireChecksum(items, bucket_bytes, slot, handle);
  }
  absl::Status WaitForLanding(const transport::LandingMark& mark) override {
    return ops_->WaitForLanding(mark);
  }

 private:
  DataOps* const ops_;
};

class BorrowedPeerWriter : public PeerWriter {
 public:
  explicit BorrowedPeerWriter(PeerWriter* writer) : writer_(writer) {}
  std::string Name() const override { return writer_->Name(); }
  MemorySpace memory_space() const override { return writer_->memory_space(); }
  ItemsHandle Prepare(absl::Span<const CopyItem> items) override { return writer_->Prepare(items); }
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override {
    return writer_->Put(items, handle, alone);
  }
  absl::Status Fence() override { return writer_->Fence(); }
  absl::StatusOr<uint64_t> Mark() override { return writer_->Mark(); }
  absl::StatusOr<bool> PollMark(uint64_t mark) override { return writer_->PollMark(mark); }
  absl::StatusOr<uint8_t*> TokenSlots(size_t count) override { return writer_->TokenSlots(count); }
  absl::Status WriteToken(uint8_t* slot, uint64_t value) override {
    return writer_->WriteToken(slot, value);
  }
  absl::StatusOr<uint64_t> ReadToken(const uint8_t* slot) override {
    return writer_->ReadToken(slot);
  }
  bool HasMailbox() const override { return writer_->HasMailbox(); }
  absl::StatusOr<std::string> CreateMailbox(int64_t slots) override {
    return writer_->CreateMailbox(slots);
  }
  absl::StatusOr<std::string> ShareMailbox(int32_t peer, int64_t first_slot,
                                           int64_t count) override {
    return writer_->ShareMailbox(peer, first_slot, count);
  }
  absl::Status OpenPeerMailbox(int32_t peer, const std::string& descriptor) override {
    return writer_->OpenPeerMailbox(peer, descriptor);
  }
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value) override {
    return writer_->Post(peer, slot, value);
  }
  absl::StatusOr<uint64_t> ReadMailbox(int64_t slot) override { return writer_->ReadMailbox(slot); }
  bool HasPutGates() const override { return writer_->HasPutGates(); }
  absl::Status SignalAfterPuts(absl::Span<const GatePost> posts) override {
    return writer_->SignalAfterPuts(posts);
  }
  absl::Status GatePuts(absl::Span<const GateWait> waits, absl::Duration timeout) override {
    return writer_->GatePuts(waits, timeout);
  }
  absl::StatusOr<int64_t> GatesTimedOut() override { return writer_->GatesTimedOut(); }

 private:
  PeerWriter* const writer_;
};

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_BORROWED_PLANE_H_
