#include "worker/backends/host/host_swap_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace wsync::host {
namespace {

std::string Errno(int e) { return absl::StrCat(std::strerror(e), " (errno ", e, ")"); }

class HostSwapArena : public plane::SwapArena {
 public:
  HostSwapArena(std::string name, void* base, int64_t bytes, int fd)
      : SwapArena(std::move(name), base, bytes), fd_(fd) {}
  ~HostSwapArena() override {
    munmap(base(), static_cast<size_t>(bytes()));
    close(fd_);
  }

  int device() const override { return -1; }

  absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewTwin(
      const std::string& name) const override {
    return NewHostSwapArena(bytes(), name);
  }

  // MAP_FIXED replaces the old mapping at once: the range is never empty.
  absl::Status DoBeginSwap(plane::SwapArena& other) override {
    auto* twin = dynamic_cast<HostSwapArena*>(&other);
    if (twin == nullptr || twin->bytes() != bytes() || twin == this) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot swap ", Describe(), " with ", other.Describe(),
          twin == this ? ": the same arena" : ": a twin must be a host arena of the same size"));
    }
    if (absl::Status s = MapOver(base(), twin->fd_); !s.ok()) {
      // A failed MAP_FIXED may already have removed the old mapping: map
      // this range's own memory again.
      return Failed(absl::StrCat("swapping ", Describe(), " with ", twin->Describe()), s, {this});
    }
    std::swap(fd_, twin->fd_);
    return absl::OkStatus();
  }

  // The twin's range, which maps the live memory since DoBeginSwap, onto
  // its new memory.
  absl::Status DoFinishSwap(plane::SwapArena& other) override {
    auto* twin = static_cast<HostSwapArena*>(&other);
    return MapOver(twin->base(), twin->fd_);
  }

  absl::Status UndoSwap(plane::SwapArena& other) override {
    auto* twin = static_cast<HostSwapArena*>(&other);
    std::swap(fd_, twin->fd_);
    std::string lost;
    for (HostSwapArena* a : {this, twin}) AppendMapBack(a, &lost);
    if (lost.empty()) return absl::OkStatus();
    return absl::InternalError(lost.substr(2));
  }

 protected:
  const char* kind() const override { return "host"; }

 private:
  // After DoBeginSwap's remap failed: maps each of `ranges` over its own
  // memory again; one that cannot be is marked unusable.
  absl::Status Failed(const std::string& what, const absl::Status& s,
                      std::initializer_list<HostSwapArena*> ranges) {
    std::string lost;
    for (HostSwapArena* a : ranges) AppendMapBack(a, &lost);
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message(),
                                               lost.empty() ? "; both keep their memory" : lost));
  }
  // Maps `a` over its own memory; on failure marks it unusable and says so
  // in *lost ("; ...").
  static void AppendMapBack(HostSwapArena* a, std::string* lost) {
    if (absl::Status back = a->MapOver(a->base(), a->fd_); !back.ok()) {
      a->MarkUnusable();
      absl::StrAppend(lost, "; mapping ", a->Describe(), " back onto its own memory failed too (",
                      back.message(), "): it is unusable");
    }
  }
  // Maps the whole of `fd` over [at, at + bytes()), replacing what is there.
  absl::Status MapOver(void* at, int fd) const {
    void* p = mmap(at, static_cast<size_t>(bytes()), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      return absl::Status(
          e == ENOMEM ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal,
          absl::StrCat("mmap MAP_FIXED at ", absl::Hex(reinterpret_cast<uintptr_t>(at)), ": ",
                       Errno(e)));
    }
    return absl::OkStatus();
  }

  int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<plane::SwapArena>> NewHostSwapArena(int64_t bytes,
                                                                   const std::string& name) {
  const std::string what = absl::StrCat("host arena '", name, "'");
  const long page = sysconf(_SC_PAGESIZE);
  absl::StatusOr<int64_t> size =
      plane::RoundArenaBytes(bytes, page > 0 ? page : plane::kSwapArenaAlignment, what);
  if (!size.ok()) return size.status();
  // memfd names are for /proc only and at most 249 bytes: a long arena
  // name (the worker's "<who> twin") is cut, never refused.
  const std::string memfd_name = absl::StrCat("wsync-arena-", name).substr(0, 200);
  const int fd = memfd_create(memfd_name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return absl::ResourceExhaustedError(absl::StrCat(what, ": memfd_create: ", Errno(e)));
  }
  if (ftruncate(fd, *size) != 0) {
    const int e = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": sizing its memfd to ", *size, " bytes: ", Errno(e)));
  }
  void* base = mmap(nullptr, static_cast<size_t>(*size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": mapping ", *size, " bytes: ", Errno(e)));
  }
  return std::unique_ptr<plane::SwapArena>(new HostSwapArena(name, base, *size, fd));
}

}  // namespace wsync::host
