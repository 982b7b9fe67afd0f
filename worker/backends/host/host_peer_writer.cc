#include "worker/backends/host/host_peer_writer.h"

#include <cstring>

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

}  // namespace wsync::exec
