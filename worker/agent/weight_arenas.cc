#include "worker/agent/weight_arenas.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace wsync::agent {

absl::StatusOr<WeightArenas::Entry> WeightArenas::Create(int64_t bytes, const std::string& name,
                                                         const std::string& who) {
  int64_t handle = 0;
  {
    absl::MutexLock lock(&mu_);
    handle = next_handle_++;
  }
  const std::string label = name.empty() ? absl::StrCat("arena-", handle) : name;
  absl::StatusOr<std::unique_ptr<plane::SwapArena>> arena = backend_->NewSwapArena(bytes, label);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrCat(who, ": weight arena '", label, "' (", bytes,
                                     " bytes): ", arena.status().message()));
  }
  Entry e{handle, std::shared_ptr<plane::SwapArena>(std::move(*arena))};
  absl::MutexLock lock(&mu_);
  arenas_[handle] = e.arena;
  return e;
}

absl::Status WeightArenas::Free(int64_t handle) {
  absl::MutexLock lock(&mu_);
  if (arenas_.erase(handle) == 0) {
    return absl::NotFoundError(absl::StrCat("no weight arena with handle ", handle,
                                            " (never created here, or freed already)"));
  }
  return absl::OkStatus();
}

std::shared_ptr<plane::SwapArena> WeightArenas::Find(const void* data, int64_t bytes) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [handle, arena] : arenas_) {
    if (arena->Contains(data, bytes)) return arena;
  }
  return nullptr;
}

bool WeightArenas::AnyUnusable() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [handle, arena] : arenas_) {
    if (!arena->usable()) return true;
  }
  return false;
}

absl::Status WeightArenas::CheckUsable(const void* data, const std::string& who,
                                       const std::string& what) const {
  std::shared_ptr<plane::SwapArena> arena = Find(data, 1);
  if (arena == nullptr || arena->usable()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, ": ", what, " lies in ", arena->Describe(),
      ", which a failed swap commit left unusable (its memory could not be mapped back); "
      "nothing reads or writes it: its owner must serve nothing from it, free it and create "
      "its weights (and register them) again"));
}

int64_t WeightArenas::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(arenas_.size());
}

}  // namespace wsync::agent
