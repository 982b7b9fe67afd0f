#include "worker/backends/host/host_peer_writer.h"

#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace wsync::exec {

absl::Status HostPeerWriter::Put(absl::Span<const CopyItem> items, ItemsHandle handle, bool alone) {
  (void)handle;
  (void)alone;
  for (size_t i = 0; i < items.size(); ++i) {
    if (absl::Status s = HostDataOps::CheckCopyItem(items[i]); !s.ok()) {
      return ItemError(s, "put", i);
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (absl::Status s = copier_.Copy(items.subspan(i, 1)); !s.ok()) {
      return ItemError(s, "put", i);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> HostPeerWriter::TokenSlots(size_t count) {
  if (tokens_.size() < count) tokens_.resize(count);
  return reinterpret_cast<uint8_t*>(tokens_.data());
}

absl::Status HostPeerWriter::WriteToken(uint8_t* slot, uint64_t value) {
  std::memcpy(slot, &value, kTokenBytes);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostPeerWriter::ReadToken(const uint8_t* slot) {
  uint64_t value = 0;
  std::memcpy(&value, slot, kTokenBytes);
  return value;
}

absl::StatusOr<std::string> HostPeerWriter::CreateMailbox(int64_t slots) {
  shared_.clear();
  mailbox_.reset();
  auto box = host::HostMailbox::Create(slots);
  if (!box.ok()) return box.status();
  mailbox_ = *std::move(box);
  return mailbox_->descriptor();
}

absl::StatusOr<std::string> HostPeerWriter::ShareMailbox(int32_t peer, int64_t first_slot,
                                                         int64_t count) {
  if (mailbox_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("sharing this writer's mailbox with worker ", peer, ": none was created"));
  }
  if (first_slot < 0 || count < 1 || count > mailbox_->slots() ||
      first_slot > mailbox_->slots() - count) {
    return absl::OutOfRangeError(
        absl::StrCat("sharing slots [", first_slot, ", +", count, ") with worker ", peer,
                     ": outside this writer's mailbox of ", mailbox_->slots()));
  }
  for (const auto& [first, s] : shared_) {
    if (first != first_slot && first < first_slot + count && first_slot < first + s.count) {
      return absl::InvalidArgumentError(absl::StrCat("sharing slots [", first_slot, ", +", count,
                                                     ") with worker ", peer,
                                                     ": they overlap slots shared before"));
    }
  }
  auto box = host::HostMailbox::Create(mailbox_->slots(), /*one_peer=*/true);
  if (!box.ok()) return box.status();
  mailbox_->Unlink();  // every peer gets its own object from now on
  Shared& s = shared_[first_slot];
  s.count = count;
  s.box = *std::move(box);
  return s.box->descriptor();
}

absl::Status HostPeerWriter::OpenPeerMailbox(int32_t peer, const std::string& descriptor) {
  auto box = host::HostMailbox::Open(descriptor, absl::StrCat("worker ", peer));
  if (!box.ok()) return box.status();
  peers_[peer] = *std::move(box);
  return absl::OkStatus();
}

absl::Status HostPeerWriter::Post(int32_t peer, int64_t slot, uint64_t value) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("posting to worker ", peer, ": its mailbox was not opened"));
  }
  if (slot < 0 || slot >= it->second->slots()) {
    return absl::OutOfRangeError(absl::StrCat("posting to worker ", peer, ": slot ", slot,
                                              " outside its mailbox of ", it->second->slots()));
  }
  it->second->Store(slot, value);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostPeerWriter::ReadMailbox(int64_t slot) {
  if (mailbox_ == nullptr) {
    return absl::FailedPreconditionError("reading this writer's mailbox: none was created");
  }
  if (slot < 0 || slot >= mailbox_->slots()) {
    return absl::OutOfRangeError(absl::StrCat(
        "reading slot ", slot, " outside this writer's mailbox of ", mailbox_->slots()));
  }
  auto it = shared_.upper_bound(slot);
  if (it != shared_.begin() && slot < std::prev(it)->first + std::prev(it)->second.count) {
    return std::prev(it)->second.box->Load(slot);
  }
  return mailbox_->Load(slot);
}

}  // namespace wsync::exec
