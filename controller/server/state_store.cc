#include "controller/server/state_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace wsync::controller {
namespace {

constexpr absl::string_view kMagic = "wsync-controller-state";

absl::Status Errno(const std::string& what) {
  return absl::Status(
      errno == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kUnavailable,
      absl::StrCat(what, ": ", std::strerror(errno)));
}

// Closes the descriptor on every path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

uint32_t Crc32(absl::string_view bytes) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (!bytes.empty()) {  // zlib takes uInt lengths
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    c = crc32(c, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<uint32_t>(c);
}

std::string FrameState(absl::string_view payload) {
  return absl::StrCat(kMagic, " format=", kStateFormat, " bytes=", payload.size(),
                      absl::StrFormat(" crc32=%08x\n", Crc32(payload)), payload);
}

std::string EncodeState(const v1::ControllerState& state) {
  return FrameState(state.SerializeAsString());
}

namespace {
void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
}  // namespace

void AppendTransferState(absl::string_view cached, absl::string_view fresh, std::string* out) {
  out->push_back(static_cast<char>((1 << 3) | 2));  // field 1 (transfers), length-delimited
  AppendVarint(cached.size() + fresh.size(), out);
  out->append(cached.data(), cached.size());
  out->append(fresh.data(), fresh.size());
}

absl::StatusOr<v1::ControllerState> DecodeState(absl::string_view bytes, const std::string& what) {
  const size_t eol = bytes.find('\n');
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("controller state file ", what, " is corrupt: ", why,
                                            " (fix or remove it, or start with "
                                            "--state_start_empty)"));
  };
  if (eol == absl::string_view::npos || eol > 200) return corrupt("no header line");
  const std::vector<absl::string_view> fields = absl::StrSplit(bytes.substr(0, eol), ' ');
  if (fields.size() != 4 || fields[0] != kMagic) {
    return corrupt(absl::StrCat("header is not '", kMagic, " format=1 bytes=N crc32=X'"));
  }
  int64_t format = 0, size = 0;
  uint32_t crc = 0;
  absl::string_view format_field = fields[1];
  if (!absl::ConsumePrefix(&format_field, "format=") || !absl::SimpleAtoi(format_field, &format)) {
    return corrupt("bad format field");
  }
  if (format != kStateFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("controller state file ", what, " has format ", format,
                     "; this controller reads format ", kStateFormat));
  }
  absl::string_view size_field = fields[2], crc_field = fields[3];
  if (!absl::ConsumePrefix(&size_field, "bytes=") || !absl::SimpleAtoi(size_field, &size) ||
      size < 0) {
    return corrupt("bad bytes field");
  }
  if (!absl::ConsumePrefix(&crc_field, "crc32=") || !absl::SimpleHexAtoi(crc_field, &crc)) {
    return corrupt("bad crc32 field");
  }
  const absl::string_view payload = bytes.substr(eol + 1);
  if (static_cast<int64_t>(payload.size()) != size) {
    return corrupt(
        absl::StrCat("header says ", size, " bytes of state, the file holds ", payload.size()));
  }
  if (Crc32(payload) != crc) {
    return corrupt(
        absl::StrFormat("checksum mismatch (header %08x, contents %08x)", crc, Crc32(payload)));
  }
  v1::ControllerState state;
  if (!state.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return corrupt("the checksum matches but the state does not parse");
  }
  return state;
}

namespace {

// The bytes of the file at `path`; NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return Errno(absl::StrCat("opening controller state file ", path));
  }
  std::string bytes;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("reading controller state file ", path));
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  return bytes;
}

absl::Status SyncDirectoryOf(const std::string& path) {
  const std::string dir = DirOf(path);
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return Errno(absl::StrCat("opening directory ", dir));
  if (::fsync(dfd.get()) != 0) return Errno(absl::StrCat("fsync of directory ", dir));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StateFlush> ParseStateFlush(absl::string_view mode) {
  if (mode == "always") return StateFlush::kEverySave;
  if (mode == "background") return StateFlush::kBackground;
  return absl::InvalidArgumentError(
      absl::StrCat("--state_fsync: '", mode, "' is neither 'always' nor 'background'"));
}

StateStore::StateStore(std::string path, StateFlush flush) : path_(std::move(path)), flush_(flush) {
  slots_[0].path = path_;
  slots_[1].path = path_ + ".alt";
  if (flush_ == StateFlush::kBackground) flusher_ = std::thread([this] { FlushLoop(); });
}

StateStore::~StateStore() {
  if (flusher_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    flusher_.join();
  }
  CloseSlots();
}

void StateStore::CloseSlots() {
  for (Slot& slot : slots_) {
    if (slot.fd >= 0) ::close(slot.fd);
    slot.fd = -1;
  }
}

absl::StatusOr<v1::ControllerState> StateStore::Load() {
  std::optional<v1::ControllerState> best;
  absl::Status first_error;
  int found = 0;
  for (const Slot& slot : slots_) {
    absl::StatusOr<std::string> bytes = ReadWhole(slot.path);
    if (absl::IsNotFound(bytes.status())) continue;
    ++found;
    absl::StatusOr<v1::ControllerState> state =
        bytes.ok() ? DecodeState(*bytes, slot.path) : bytes.status();
    if (!state.ok()) {
      if (first_error.ok()) first_error = state.status();
      continue;
    }
    if (!best.has_value() || state->save_sequence() > best->save_sequence()) {
      best = *state;
      current_ = static_cast<int>(&slot - slots_);
    }
  }
  if (!best.has_value()) {
    if (found > 0) return first_error;
    return v1::ControllerState();
  }
  if (!first_error.ok()) {
    spdlog::warn("[controller] {}; using the other state file (save {})", first_error.ToString(),
                 best->save_sequence());
  }
  sequence_ = best->save_sequence();
  return *std::move(best);
}

absl::Status StateStore::Write(Slot& slot, const std::string& bytes) {
  if (slot.fd < 0) {
    slot.created = ::access(slot.path.c_str(), F_OK) != 0;
    slot.fd = ::open(slot.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (slot.fd < 0) return Errno(absl::StrCat("opening controller state file ", slot.path));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pwrite(slot.fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("writing controller state file ", slot.path));
    done += static_cast<size_t>(n);
  }
  // Only when the size changed (a metadata update); usually it does not.
  struct stat st {};
  if (::fstat(slot.fd, &st) != 0) return Errno(absl::StrCat("stat of ", slot.path));
  if (st.st_size != static_cast<off_t>(bytes.size()) &&
      ::ftruncate(slot.fd, static_cast<off_t>(bytes.size())) != 0) {
    return Errno(absl::StrCat("truncating controller state file ", slot.path));
  }
  return absl::OkStatus();
}

absl::Status StateStore::SyncSlot(int index) {
  Slot& slot = slots_[index];
  if (data_sync_(slot.fd) != 0) return Errno(absl::StrCat("fdatasync of ", slot.path));
  if (slot.created) {
    if (absl::Status s = SyncDirectoryOf(slot.path); !s.ok()) return s;
    slot.created = false;
  }
  return absl::OkStatus();
}

absl::Status StateStore::Save(const v1::ControllerState& state) {
  return SaveSerialized(state.SerializeAsString());
}

absl::Status StateStore::SaveSerialized(std::string payload) {
  const int64_t sequence = sequence_ + 1;
  payload.push_back(static_cast<char>(6 << 3));  // save_sequence (6), varint
  AppendVarint(static_cast<uint64_t>(sequence), &payload);
  const int index = 1 - current_;  // never over the file holding the current state
  if (flush_ == StateFlush::kBackground) {
    // The file kept must be on the disk before the other one is written
    // over: at most one file is ever unflushed, so a power cut tears at most
    // one. Waits only when saves come faster than the flusher.
    absl::MutexLock lock(&mu_);
    while (flushed_ < written_at_[current_]) cv_.Wait(&mu_);
  }
  // Writing while the flusher syncs the same descriptor is safe: the flusher
  // syncs it again in its next round (written_at_ below).
  if (absl::Status s = Write(slots_[index], FrameState(payload)); !s.ok()) return s;
  if (flush_ == StateFlush::kEverySave) {
    // Not current until durable: a failed sync leaves the next save going
    // over this (possibly torn) file, never over the durable one.
    if (absl::Status s = SyncSlot(index); !s.ok()) return s;
  }
  sequence_ = sequence;
  current_ = index;
  ++saves_;
  if (flush_ == StateFlush::kEverySave) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  written_at_[index] = ++written_;
  cv_.Signal();
  return absl::OkStatus();
}

void StateStore::FlushLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (flushed_ == written_ && !stopping_) cv_.Wait(&mu_);
    if (flushed_ == written_) return;  // stopping, nothing pending
    const int64_t target = written_;   // later saves get the next round
    const bool which[2] = {written_at_[0] > flushed_, written_at_[1] > flushed_};
    mu_.Unlock();
    absl::Status s;
    for (int i = 0; i < 2 && s.ok(); ++i) {
      if (which[i]) s = SyncSlot(i);
    }
    mu_.Lock();
    if (!s.ok()) {
      if (++failed_flushes_in_a_row_ == 1) {  // once per streak
        spdlog::error(
            "[controller] flushing the controller state {} to the disk failed ({}): a "
            "power cut now would lose the latest delivered versions (logged once until a "
            "flush succeeds; wsync_state_save_failures_total counts each)",
            path_, s.ToString());
      }
      if (flush_failed_) flush_failed_(s, failed_flushes_in_a_row_);
      if (flush_error_.ok()) flush_error_ = s;
    } else if (failed_flushes_in_a_row_ > 0) {
      spdlog::info(
          "[controller] flushing the controller state {} works again after {} failed "
          "flush(es)",
          path_, failed_flushes_in_a_row_);
      failed_flushes_in_a_row_ = 0;
    }
    flushed_ = target;
    cv_.SignalAll();
  }
}

absl::Status StateStore::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t target = written_;
  while (flushed_ < target) cv_.Wait(&mu_);
  return std::exchange(flush_error_, absl::OkStatus());
}

absl::StatusOr<std::string> StateStore::MoveAside() {
  CloseSlots();
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  std::string first;
  for (const Slot& slot : slots_) {
    if (::access(slot.path.c_str(), F_OK) != 0) continue;
    const std::string aside = absl::StrCat(slot.path, ".corrupt-", now);
    if (::rename(slot.path.c_str(), aside.c_str()) != 0) {
      return Errno(absl::StrCat("moving ", slot.path, " aside to ", aside));
    }
    if (first.empty()) first = aside;
  }
  sequence_ = 0;
  current_ = 1;
  return first;
}

}  // namespace wsync::controller
