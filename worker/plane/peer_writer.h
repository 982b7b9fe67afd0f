// Direct writes: the second way bytes reach another worker, beside the
// Transport. A PeerWriter puts items from this worker's memory straight into
// a peer worker's buffers mapped into this process (Backend::OpenBuffer with
// peer = true: shared memory on the host, CUDA IPC with peer access on a
// GPU), fences them, and owns the few bytes of the ready / done tokens that
// the executor exchanges over the transport around the puts (executor.h).
// tests/worker/plane/peer_writer_conformance.h is the contract's test suite.
#ifndef WSYNC_WORKER_PLANE_PEER_WRITER_H_
#define WSYNC_WORKER_PLANE_PEER_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/plane/data_ops.h"

namespace wsync::exec {

class PeerWriter {
 public:
  virtual ~PeerWriter() = default;

  virtual std::string Name() const = 0;
  // Where the sources and the tokens live (the transport's space).
  virtual MemorySpace memory_space() const = 0;

  // As DataOps::Prepare, for Put.
  virtual ItemsHandle Prepare(absl::Span<const CopyItem> items);

  // src (this worker's memory) -> dst (a peer's mapped buffer), converted
  // like DataOps::Copy (common/cast.h, bit for bit). Every item is checked
  // before any is issued: a bad call writes nothing and its error names the
  // item (ItemError). Puts may be asynchronous and run beside the data ops'
  // calls (a device uses other streams and its copy engines); puts of one
  // writer complete in no particular order among themselves. `alone`: the
  // caller issues no other work while these puts run, so a device may give
  // them all of itself. `handle`: from Prepare(items), or {}.
  virtual absl::Status Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) = 0;
  // Returns once every Put issued so far completed and its bytes are
  // visible to the peer, reporting any deferred error (naming the item where
  // known). DataOps::Synchronize does not wait for puts; Fence does not wait
  // for the data ops.
  virtual absl::Status Fence() = 0;

  // The tokens: `count` slots of kTokenBytes in the transport's memory
  // space, for the transport to send from and receive into. The slots stay
  // valid until the next call asking for more. Reading and writing a slot is
  // synchronous and ordered after the transport rounds that returned, not
  // after data-op calls still queued (the executor reads the ready tokens
  // while local copies run).
  static constexpr size_t kTokenBytes = 8;
  virtual absl::StatusOr<uint8_t*> TokenSlots(size_t count) = 0;
  virtual absl::Status WriteToken(uint8_t* slot, uint64_t value) = 0;
  virtual absl::StatusOr<uint64_t> ReadToken(const uint8_t* slot) = 0;

 private:
  uint64_t next_handle_ = 0;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_PLANE_PEER_WRITER_H_
