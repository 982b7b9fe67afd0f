// Direct writes: the second way bytes reach another worker, beside the
// Transport. A PeerWriter puts items from this worker's memory straight into
// a peer worker's buffers mapped into this process (Backend::OpenBuffer with
// peer = true: shared memory on the host, CUDA IPC with peer access on a
// GPU), fences them, and owns the few bytes of the ready / done tokens that
// the executor exchanges around the puts (executor.h): through peer
// mailboxes where the writer has them (HasMailbox), else over the transport.
// tests/worker/plane/peer_writer_conformance.h is the contract's test suite.
#ifndef WSYNC_WORKER_PLANE_PEER_WRITER_H_
#define WSYNC_WORKER_PLANE_PEER_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  // Put marks: Mark() names every Put issued before it; PollMark(mark) says,
  // without waiting, whether those puts completed and their bytes are
  // visible to the peers (as after a Fence, and so ordered before a later
  // Post), reporting their deferred errors. Lets a writer tell its peers
  // which parts of its puts landed while later ones still move. The
  // default: PollMark fences, so a mark is reached once polled.
  virtual absl::StatusOr<uint64_t> Mark();
  virtual absl::StatusOr<bool> PollMark(uint64_t mark);

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

  // Mailboxes: 8-byte slots in this writer's own memory that the direct-write
  // peers of its memory domain map and post into (CUDA: cudaMalloc'd memory
  // shared by CUDA IPC; host: a POSIX shared-memory object), so that tokens
  // need no transport round once the descriptors were exchanged. Optional:
  // a writer without them (HasMailbox() false) answers UNIMPLEMENTED and the
  // executor keeps its token rounds.
  static constexpr size_t kMailboxDescriptorBytes = 192;
  // Most slots a mailbox may have (a peer's descriptor declaring more is
  // refused): 8 per worker id of a transport of up to 2^20 ranks.
  static constexpr int64_t kMaxMailboxSlots = int64_t{8} << 20;
  virtual bool HasMailbox() const { return false; }
  // Creates this writer's mailbox of `slots` zeroed slots (1 ..
  // kMaxMailboxSlots), replacing an earlier one (peers that mapped that one
  // keep it until they close theirs), and returns its descriptor: exactly
  // kMailboxDescriptorBytes, for the transport to carry to the peers.
  virtual absl::StatusOr<std::string> CreateMailbox(int64_t slots);
  // The descriptor to send to `peer` (after CreateMailbox), which posts only
  // into slots [first_slot, first_slot + count). UNIMPLEMENTED (the
  // default): CreateMailbox's descriptor serves every peer. The host
  // backend gives each peer an object of its own that the peer unlinks as
  // soon as it mapped it, so no name outlives the exchange (a killed
  // process leaves nothing in /dev/shm).
  virtual absl::StatusOr<std::string> ShareMailbox(int32_t peer, int64_t first_slot, int64_t count);
  // Maps worker `peer`'s mailbox from the descriptor it sent (replacing an
  // earlier mapping of that peer's). A descriptor that is malformed, names
  // memory this process cannot map, or declares a size that differs from
  // the memory's is an error naming the peer; nothing is mapped then.
  virtual absl::Status OpenPeerMailbox(int32_t peer, const std::string& descriptor);
  // Writes `value` into slot `slot` of `peer`'s mailbox (opened before);
  // synchronous. Ordered after every Put that a Fence returned for before
  // this call, and after every earlier Post to that peer: a peer that reads
  // the value may read those puts' bytes and the earlier posts' values. A
  // slot outside the peer's mailbox is an error.
  virtual absl::Status Post(int32_t peer, int64_t slot, uint64_t value);
  // Slot `slot` of this writer's own mailbox, as last posted (0 if never);
  // cheap enough to poll (an acquire load on the host, an 8-byte copy on a
  // stream of its own on a GPU).
  virtual absl::StatusOr<uint64_t> ReadMailbox(int64_t slot);

  // Put gates: points in this writer's stream of puts that its peers' puts
  // reach too, so that the writers of a group move through the phases of
  // their puts together (docs/direct-writes.md, "Phase gates"). Only a
  // matter of speed: puts are correct in any order, so a gate opens by
  // itself once `timeout` passed. The default (every writer with a mailbox)
  // fences and waits on the host; a device gates on its own streams.
  struct GatePost {  // `value` into slot `slot` of `peer`'s mailbox
    int32_t peer = 0;
    int64_t slot = 0;
    uint64_t value = 0;
  };
  struct GateWait {  // slot `slot` of this writer's own mailbox >= `at_least`
    int64_t slot = 0;
    uint64_t at_least = 0;
  };
  virtual bool HasPutGates() const { return HasMailbox(); }
  // Once every Put issued before this call completed and its bytes are
  // visible (as after a Fence), writes each post (asynchronously on a
  // device). A peer whose mailbox is not open or a slot outside it is an
  // error naming them (a device checks every post before it posts any).
  virtual absl::Status SignalAfterPuts(absl::Span<const GatePost> posts);
  // Puts issued after this call start once every wait holds (unsigned
  // compare; a value that only grows), or once `timeout` (> 0) passed since
  // the puts before it completed, whichever is first; returns without
  // waiting on a device. A slot outside this writer's mailbox is an error.
  virtual absl::Status GatePuts(absl::Span<const GateWait> waits, absl::Duration timeout);
  // Gates that opened by their timeout so far (read after a Fence on a
  // device: gates still queued are not counted yet).
  virtual absl::StatusOr<int64_t> GatesTimedOut() { return gates_timed_out_; }

 private:
  uint64_t next_handle_ = 0;
  uint64_t next_mark_ = 0;
  int64_t gates_timed_out_ = 0;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_PLANE_PEER_WRITER_H_
