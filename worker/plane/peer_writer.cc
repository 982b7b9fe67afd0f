#include "worker/plane/peer_writer.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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

absl::Status PeerWriter::SignalAfterPuts(absl::Span<const GatePost> posts) {
  if (absl::Status s = Fence(); !s.ok()) return s;
  for (const GatePost& p : posts) {
    if (absl::Status s = Post(p.peer, p.slot, p.value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PeerWriter::GatePuts(absl::Span<const GateWait> waits, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a put gate's timeout must be positive, not ", absl::FormatDuration(timeout)));
  }
  if (absl::Status s = Fence(); !s.ok()) return s;
  const absl::Time open_at = absl::Now() + timeout;
  for (int64_t n = 0;; ++n) {
    bool all = true;
    for (const GateWait& w : waits) {
      absl::StatusOr<uint64_t> got = ReadMailbox(w.slot);
      if (!got.ok()) return got.status();
      all = all && *got >= w.at_least;  // every slot read: a bad one errs at once
    }
    if (all) return absl::OkStatus();
    if (absl::Now() >= open_at) {
      ++gates_timed_out_;
      return absl::OkStatus();
    }
    if (n >= 200) {
      absl::SleepFor(absl::Microseconds(20));
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace wsync::exec
