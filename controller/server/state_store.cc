#include "controller/server/state_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

absl::Status Errno(const std::string& what) {
  return absl::Status(
      errno == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kUnavailable,
      absl::StrCat(what, ": ", std::strerror(errno)));
}

// Writes all of `bytes` to `fd`.
absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("writing ", what));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
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
  // Closes now, reporting the error close() may carry (deferred writes).
  bool Close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

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
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::string EncodeState(const v1::ControllerState& state) {
  const std::string payload = state.SerializeAsString();
  return absl::StrCat(kMagic, " format=", kStateFormat, " bytes=", payload.size(),
                      absl::StrFormat(" crc32=%08x\n", Crc32(payload)), payload);
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

absl::StatusOr<v1::ControllerState> StateStore::Load() const {
  Fd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return v1::ControllerState();
    return Errno(absl::StrCat("opening controller state file ", path_));
  }
  std::string bytes;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("reading controller state file ", path_));
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  return DecodeState(bytes, path_);
}

absl::StatusOr<StateFlush> ParseStateFlush(absl::string_view mode) {
  if (mode == "always") return StateFlush::kEverySave;
  if (mode == "background") return StateFlush::kBackground;
  return absl::InvalidArgumentError(
      absl::StrCat("--state_fsync: '", mode, "' is neither 'always' nor 'background'"));
}

StateStore::StateStore(std::string path, StateFlush flush)
    : path_(std::move(path)), flush_(flush) {
  if (flush_ == StateFlush::kBackground) flusher_ = std::thread([this] { FlushLoop(); });
}

StateStore::~StateStore() {
  if (!flusher_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  flusher_.join();
}

absl::Status StateStore::Replace(const std::string& bytes, bool sync) {
  const std::string tmp = path_ + ".tmp";
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (fd.get() < 0) return Errno(absl::StrCat("creating ", tmp));
    if (absl::Status s = WriteAll(fd.get(), bytes, tmp); !s.ok()) return s;
    if (sync && ::fsync(fd.get()) != 0) return Errno(absl::StrCat("fsync of ", tmp));
    if (!fd.Close()) return Errno(absl::StrCat("closing ", tmp));
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    return Errno(absl::StrCat("renaming ", tmp, " to ", path_));
  }
  return absl::OkStatus();
}

absl::Status StateStore::SyncToDisk() const {
  {
    Fd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return Errno(absl::StrCat("opening ", path_, " to flush it"));
    if (::fsync(fd.get()) != 0) return Errno(absl::StrCat("fsync of ", path_));
  }
  // The rename itself is durable once the directory is.
  const std::string dir = DirOf(path_);
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return Errno(absl::StrCat("opening directory ", dir));
  if (::fsync(dfd.get()) != 0) return Errno(absl::StrCat("fsync of directory ", dir));
  return absl::OkStatus();
}

absl::Status StateStore::Save(const v1::ControllerState& state) {
  const bool every = flush_ == StateFlush::kEverySave;
  if (absl::Status s = Replace(EncodeState(state), /*sync=*/every); !s.ok()) return s;
  if (every) {
    if (absl::Status s = SyncToDisk(); !s.ok()) return s;
  } else {
    absl::MutexLock lock(&mu_);
    ++written_;
    cv_.Signal();
  }
  ++saves_;
  return absl::OkStatus();
}

void StateStore::FlushLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (flushed_ == written_ && !stopping_) cv_.Wait(&mu_);
    if (flushed_ == written_) return;  // stopping, nothing pending
    const int64_t target = written_;   // later saves get the next round
    mu_.Unlock();
    absl::Status s = SyncToDisk();
    mu_.Lock();
    if (!s.ok()) {
      spdlog::error("[controller] flushing the controller state {} to the disk failed ({}): a "
                    "power cut now would lose the latest delivered versions",
                    path_, s.ToString());
      if (flush_error_.ok()) flush_error_ = s;
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

absl::StatusOr<std::string> StateStore::MoveAside() const {
  const std::string aside = absl::StrCat(path_, ".corrupt-", absl::ToUnixSeconds(absl::Now()));
  if (::rename(path_.c_str(), aside.c_str()) != 0) {
    return Errno(absl::StrCat("moving ", path_, " aside to ", aside));
  }
  return aside;
}

}  // namespace wsync::controller
