// The host backend's direct writer: puts into a peer's POSIX shared memory
// mapped into this process, synchronously, with HostDataOps' conversions
// (common/cast.h). Tokens are plain host memory; the mailbox is a shared
// memory object (host_mailbox.h). Not thread-safe.
#ifndef WSYNC_WORKER_BACKENDS_HOST_HOST_PEER_WRITER_H_
#define WSYNC_WORKER_BACKENDS_HOST_HOST_PEER_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "worker/backends/host/host_data_ops.h"
#include "worker/backends/host/host_mailbox.h"
#include "worker/plane/peer_writer.h"

namespace wsync::exec {

class HostPeerWriter : public PeerWriter {
 public:
  std::string Name() const override { return "host-shm"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  // Every item is checked before any byte is written; errors are "put item
  // <i>: ...".
  absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) override;
  // Puts are complete when Put returns.
  absl::Status Fence() override { return absl::OkStatus(); }
  absl::StatusOr<uint8_t*> TokenSlots(size_t count) override;
  absl::Status WriteToken(uint8_t* slot, uint64_t value) override;
  absl::StatusOr<uint64_t> ReadToken(const uint8_t* slot) override;

  bool HasMailbox() const override { return true; }
  absl::StatusOr<std::string> CreateMailbox(int64_t slots) override;
  // An object of its own for `peer` (of the mailbox's slot count; its slots
  // [first_slot, first_slot + count) are read from it), which the peer
  // unlinks once mapped; the shared object's name is unlinked at the first
  // call (no peer is sent it any more). Nothing stays in /dev/shm once
  // every peer mapped its object, whoever is killed later.
  absl::StatusOr<std::string> ShareMailbox(int32_t peer, int64_t first_slot,
                                           int64_t count) override;
  absl::Status OpenPeerMailbox(int32_t peer, const std::string& descriptor) override;
  // A release store: puts are complete when Put returns.
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value) override;
  absl::StatusOr<uint64_t> ReadMailbox(int64_t slot) override;

 private:
  HostDataOps copier_;
  std::vector<uint64_t> tokens_;
  std::unique_ptr<host::HostMailbox> mailbox_;
  struct Shared {
    int64_t count = 0;
    std::unique_ptr<host::HostMailbox> box;
  };
  std::map<int64_t, Shared> shared_;  // by first slot
  std::map<int32_t, std::unique_ptr<host::HostMailbox>> peers_;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_BACKENDS_HOST_HOST_PEER_WRITER_H_
