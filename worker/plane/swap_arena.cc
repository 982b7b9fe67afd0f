#include "worker/plane/swap_arena.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace wsync::plane {

SwapArena::~SwapArena() {
  if (partner_ != nullptr) {
    partner_->partner_ = nullptr;
    partner_->began_ = false;
  }
}

absl::Status SwapArena::BeginSwap(SwapArena& twin) {
  if (&twin != this) {
    for (const SwapArena* a :
         {static_cast<const SwapArena*>(this), static_cast<const SwapArena*>(&twin)}) {
      if (a->partner_ == nullptr) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot swap ", Describe(), " with ", twin.Describe(), ": ", a->Describe(),
                       "'s swap with ", a->partner_->Describe(), " is not finished (FinishSwap)"));
    }
  }
  RETURN_IF_ERROR(DoBeginSwap(twin));
  partner_ = &twin;
  twin.partner_ = this;
  began_ = true;
  twin.began_ = false;
  return absl::OkStatus();
}

absl::Status SwapArena::FinishSwap(SwapArena& twin) {
  const std::string what =
      absl::StrCat("finishing a swap of ", Describe(), " with ", twin.Describe());
  if (partner_ == nullptr || (partner_ == &twin && !began_)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": none was begun (BeginSwap)"));
  }
  if (partner_ != &twin || !began_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", Describe(), "'s unfinished swap is with ", partner_->Describe(),
                     ", not ", twin.Describe()));
  }
  partner_ = nullptr;
  twin.partner_ = nullptr;
  began_ = false;
  absl::Status s = DoFinishSwap(twin);
  if (s.ok()) return s;
  twin.MarkUnusable();
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message(), "; the twin is unusable"));
}

absl::Status SwapArena::SwapWith(SwapArena& twin) {
  RETURN_IF_ERROR(BeginSwap(twin));
  partner_ = nullptr;
  twin.partner_ = nullptr;
  began_ = false;
  const absl::Status s = DoFinishSwap(twin);
  if (s.ok()) return s;
  // Undone, each range is back on its own memory: neither is marked
  // unusable unless UndoSwap could not put it back.
  const absl::Status back = UndoSwap(twin);
  return absl::Status(
      s.code(),
      absl::StrCat("swapping ", Describe(), " with ", twin.Describe(), ": ", s.message(),
                   back.ok() ? "; both keep their memory" : absl::StrCat("; ", back.message())));
}

std::string SwapArena::Describe() const {
  return absl::StrFormat("%s arena '%s' (%d bytes at %p)", kind(), name_, bytes_, base_);
}

bool SwapArena::Contains(const void* data, int64_t bytes) const {
  if (bytes < 0) return false;
  const auto begin = reinterpret_cast<uintptr_t>(base_);
  const auto p = reinterpret_cast<uintptr_t>(data);
  if (p < begin) return false;
  const uint64_t offset = p - begin;
  return offset <= static_cast<uint64_t>(bytes_) &&
         static_cast<uint64_t>(bytes) <= static_cast<uint64_t>(bytes_) - offset;
}

absl::StatusOr<int64_t> RoundArenaBytes(int64_t bytes, int64_t granularity,
                                        const std::string& what) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": an arena needs a positive size, got ", bytes, " bytes"));
  }
  if (granularity <= 0) {
    return absl::InternalError(
        absl::StrCat(what, ": allocation granularity ", granularity, " is not positive"));
  }
  const int64_t rest = bytes % granularity;
  if (rest == 0) return bytes;
  if (bytes > std::numeric_limits<int64_t>::max() - (granularity - rest)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes, " bytes rounded up to ",
                                                   granularity, "-byte granules overflow int64"));
  }
  return bytes + (granularity - rest);
}

}  // namespace wsync::plane
