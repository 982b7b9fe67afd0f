// The host backend's direct writer: puts into a peer's POSIX shared memory
// mapped into this process, synchronously, with HostDataOps' conversions
// (common/cast.h). Tokens are plain host memory. Not thread-safe.
#ifndef WSYNC_WORKER_BACKENDS_HOST_HOST_PEER_WRITER_H_
#define WSYNC_WORKER_BACKENDS_HOST_HOST_PEER_WRITER_H_

#include <cstdint>
#include <vector>

#include "worker/backends/host/host_data_ops.h"
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

 private:
  HostDataOps copier_;
  std::vector<uint64_t> tokens_;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_BACKENDS_HOST_HOST_PEER_WRITER_H_
