#include "worker/plane/peer_writer.h"

#include "absl/strings/str_cat.h"

namespace wsync::exec {

ItemsHandle PeerWriter::Prepare(absl::Span<const CopyItem> items) {
  (void)items;
  return ItemsHandle{++next_handle_};
}

absl::StatusOr<uint64_t> PeerWriter::Mark() { return ++next_mark_; }

absl::StatusOr<bool> PeerWriter::PollMark(uint64_t mark) {
  if (mark == 0 || mark > next_mark_) {
    return absl::InvalidArgumentError(absl::StrCat("put mark ", mark, " was never made"));
  }
  if (absl::Status s = Fence(); !s.ok()) return s;
  return true;
}

absl::StatusOr<std::string> PeerWriter::CreateMailbox(int64_t slots) {
  (void)slots;
  return absl::UnimplementedError(absl::StrCat("peer writer ", Name(), " has no mailbox"));
}

absl::StatusOr<std::string> PeerWriter::ShareMailbox(int32_t peer, int64_t first_slot,
                                                     int64_t count) {
  (void)first_slot;
  (void)count;
  return absl::UnimplementedError(absl::StrCat(
      "peer writer ", Name(), " shares one mailbox with every peer (worker ", peer, ")"));
}

absl::Status PeerWriter::OpenPeerMailbox(int32_t peer, const std::string& descriptor) {
  (void)descriptor;
  return absl::UnimplementedError(
      absl::StrCat("peer writer ", Name(), " has no mailbox (opening worker ", peer, "'s)"));
}

absl::Status PeerWriter::Post(int32_t peer, int64_t slot, uint64_t value) {
  (void)slot;
  (void)value;
  return absl::UnimplementedError(
      absl::StrCat("peer writer ", Name(), " has no mailbox (posting to worker ", peer, ")"));
}

absl::StatusOr<uint64_t> PeerWriter::ReadMailbox(int64_t slot) {
  (void)slot;
  return absl::UnimplementedError(absl::StrCat("peer writer ", Name(), " has no mailbox"));
}

}  // namespace wsync::exec
