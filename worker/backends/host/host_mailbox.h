// The host backend's mailboxes (PeerWriter's mailbox contract): a POSIX
// shared-memory object of 8-byte slots that its owner creates and unlinks,
// and that peers map by the name its descriptor carries. Slots are read and
// written with acquire / release atomics.
//
// Descriptor (PeerWriter::kMailboxDescriptorBytes): the magic "WSMBXH02" (02: five slots per peer,
// executor.h) (an object any number of peers may open; its owner unlinks it) or "WSMBXO02" (an
// object for one peer, which unlinks the name as soon as it mapped it), the slot count (8 bytes,
// little endian), then the object's name ("/wsync-mbx-" and [A-Za-z0-9_-], NUL-terminated,
// NUL-padded).
#ifndef WSYNC_WORKER_BACKENDS_HOST_HOST_MAILBOX_H_
#define WSYNC_WORKER_BACKENDS_HOST_HOST_MAILBOX_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backends/host/shm_mapping.h"

namespace wsync::host {

class HostMailbox {
 public:
  // A fresh, zeroed mailbox of `slots` slots under a process-unique name;
  // `one_peer`: its descriptor tells the one peer that opens it to unlink
  // the name once mapped.
  static absl::StatusOr<std::unique_ptr<HostMailbox>> Create(int64_t slots, bool one_peer = false);
  // Maps the mailbox `descriptor` describes; `who` names its owner in
  // errors. Refuses a malformed descriptor, a name outside the mailbox
  // namespace, and an object whose size is not the declared slot count's.
  static absl::StatusOr<std::unique_ptr<HostMailbox>> Open(const std::string& descriptor,
                                                           const std::string& who);
  ~HostMailbox();  // unlinks the object's name if this process created it
  // The owner unlinks the name now (peers that mapped it keep their
  // mapping; no new peer can open it). Idempotent.
  void Unlink();
  HostMailbox(const HostMailbox&) = delete;
  HostMailbox& operator=(const HostMailbox&) = delete;

  const std::string& descriptor() const { return descriptor_; }
  int64_t slots() const { return slots_; }
  // Release store / acquire load of slot `slot` (< slots(); checked by the
  // caller).
  void Store(int64_t slot, uint64_t value);
  uint64_t Load(int64_t slot) const;

 private:
  HostMailbox(std::shared_ptr<ShmMapping> mapping, int64_t slots, std::string descriptor,
              bool owner)
      : mapping_(std::move(mapping)),
        slots_(slots),
        descriptor_(std::move(descriptor)),
        owner_(owner) {}
  uint64_t* slot_ptr(int64_t slot) const {
    return reinterpret_cast<uint64_t*>(mapping_->data()) + slot;
  }
  std::shared_ptr<ShmMapping> mapping_;
  int64_t slots_;
  std::string descriptor_;
  bool owner_;
  bool unlinked_ = false;
};

}  // namespace wsync::host

#endif  // WSYNC_WORKER_BACKENDS_HOST_HOST_MAILBOX_H_
