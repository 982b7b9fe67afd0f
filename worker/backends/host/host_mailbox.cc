#include "worker/backends/host/host_mailbox.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/plane/peer_writer.h"

namespace wsync::host {
namespace {

constexpr char kMagic[8] = {'W', 'S', 'M', 'B', 'X', 'H', '0', '2'};
constexpr char kOnePeerMagic[8] = {'W', 'S', 'M', 'B', 'X', 'O', '0', '2'};
constexpr char kPrefix[] = "/wsync-mbx-";
constexpr size_t kNameOffset = 16;
constexpr size_t kBytes = exec::PeerWriter::kMailboxDescriptorBytes;

bool NameOk(const std::string& name) {
  if (!absl::StartsWith(name, kPrefix) || name.size() <= sizeof(kPrefix) - 1) return false;
  for (size_t i = sizeof(kPrefix) - 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  }
  return true;
}

std::string Describe(const std::string& name, int64_t slots, bool one_peer) {
  std::string d(kBytes, '\0');
  std::memcpy(d.data(), one_peer ? kOnePeerMagic : kMagic, sizeof(kMagic));
  const uint64_t n = static_cast<uint64_t>(slots);
  for (int b = 0; b < 8; ++b) d[8 + b] = static_cast<char>((n >> (8 * b)) & 0xff);
  std::memcpy(d.data() + kNameOffset, name.data(), name.size());
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostMailbox>> HostMailbox::Create(int64_t slots, bool one_peer) {
  if (slots < 1 || slots > exec::PeerWriter::kMaxMailboxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("a mailbox of ", slots, " slots (1 to ",
                                                   exec::PeerWriter::kMaxMailboxSlots, ")"));
  }
  static std::atomic<uint64_t> counter{0};
  const std::string name = absl::StrCat(kPrefix, getpid(), "-", counter.fetch_add(1), "-",
                                        absl::ToUnixNanos(absl::Now()) & 0xffffffffff);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("creating mailbox shm '", name, "': ", std::strerror(errno)));
  }
  const int rc = ftruncate(fd, slots * 8);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("sizing mailbox shm '", name, "' to ", slots * 8,
                                            " bytes: ", std::strerror(err)));
  }
  auto mapping = ShmMapping::Open(name);
  if (!mapping.ok()) {
    shm_unlink(name.c_str());
    return mapping.status();
  }
  return std::unique_ptr<HostMailbox>(
      new HostMailbox(*std::move(mapping), slots, Describe(name, slots, one_peer), /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<HostMailbox>> HostMailbox::Open(const std::string& descriptor,
                                                               const std::string& who) {
  const std::string what = absl::StrCat(who, "'s mailbox descriptor");
  const bool one_peer = descriptor.size() == kBytes &&
                        std::memcmp(descriptor.data(), kOnePeerMagic, sizeof(kMagic)) == 0;
  if (descriptor.size() != kBytes ||
      (!one_peer && std::memcmp(descriptor.data(), kMagic, sizeof(kMagic)) != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is malformed (", descriptor.size(), " bytes, expected ", kBytes,
                     " starting with WSMBXH02 or WSMBXO02; 01 is the layout of four slots per peer "
                     "before session 24)"));
  }
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t{static_cast<uint8_t>(descriptor[8 + b])} << (8 * b);
  const char* name_begin = descriptor.data() + kNameOffset;
  const void* nul = std::memchr(name_begin, '\0', kBytes - kNameOffset);
  if (nul == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": its name is not terminated"));
  }
  const std::string name(name_begin, static_cast<const char*>(nul) - name_begin);
  if (!NameOk(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " names '", name, "', not a mailbox (", kPrefix, "...)"));
  }
  if (n < 1 || n > static_cast<uint64_t>(exec::PeerWriter::kMaxMailboxSlots)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " declares ", n, " slots (1 to ",
                                                   exec::PeerWriter::kMaxMailboxSlots, ")"));
  }
  auto mapping = ShmMapping::Open(name);
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(),
                        absl::StrCat(what, ": ", mapping.status().message()));
  }
  if ((*mapping)->size() != static_cast<int64_t>(n * 8)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " declares ", n, " slots but '", name,
                                                   "' has ", (*mapping)->size(), " bytes"));
  }
  // Made for this process alone: its name has served (the mapping stays).
  if (one_peer) shm_unlink(name.c_str());
  return std::unique_ptr<HostMailbox>(
      new HostMailbox(*std::move(mapping), static_cast<int64_t>(n), descriptor, /*owner=*/false));
}

HostMailbox::~HostMailbox() { Unlink(); }

void HostMailbox::Unlink() {
  // ENOENT when a one-peer object's peer unlinked it already.
  if (owner_ && !unlinked_) shm_unlink(mapping_->name().c_str());
  unlinked_ = true;
}

void HostMailbox::Store(int64_t slot, uint64_t value) {
  __atomic_store_n(slot_ptr(slot), value, __ATOMIC_RELEASE);
}

uint64_t HostMailbox::Load(int64_t slot) const {
  return __atomic_load_n(slot_ptr(slot), __ATOMIC_ACQUIRE);
}

}  // namespace wsync::host
