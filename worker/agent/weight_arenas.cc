#include "worker/agent/weight_arenas.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

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

absl::StatusOr<std::pair<WeightArenas::Entry, WeightArenas::Entry>> WeightArenas::CreatePair(
    int64_t bytes, const std::string& name, const std::string& who) {
  std::string label = name;
  if (label.empty()) {
    absl::MutexLock lock(&mu_);
    label = absl::StrCat("pair-", next_pair_++);
  }
  absl::StatusOr<Entry> a = Create(bytes, absl::StrCat(label, ".0"), who);
  if (!a.ok()) return a.status();
  absl::StatusOr<Entry> b = Create(bytes, absl::StrCat(label, ".1"), who);
  if (!b.ok()) {
    Free(a->handle).IgnoreError();  // made by this call: known
    return b.status();
  }
  absl::MutexLock lock(&mu_);
  partner_[a->arena.get()] = b->arena;
  partner_[b->arena.get()] = a->arena;
  auto flip = std::make_shared<Flip>();
  flips_[a->arena.get()] = flip;
  flips_[b->arena.get()] = flip;
  return std::make_pair(*std::move(a), *std::move(b));
}

absl::Status WeightArenas::Free(int64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = arenas_.find(handle);
  if (it == arenas_.end()) {
    return absl::NotFoundError(absl::StrCat("no weight arena with handle ", handle,
                                            " (never created here, or freed already)"));
  }
  const plane::SwapArena* arena = it->second.get();
  if (auto f = flips_.find(arena); f != flips_.end()) {
    f->second->awaiting = nullptr;  // wakes a sync awaiting it: AwaitAck then refuses
  }
  if (auto p = partner_.find(arena); p != partner_.end()) {
    partner_.erase(p->second.get());
    flips_.erase(p->second.get());
    partner_.erase(p);
  }
  flips_.erase(arena);
  arenas_.erase(it);
  return absl::OkStatus();
}

std::shared_ptr<plane::SwapArena> WeightArenas::PartnerOf(const plane::SwapArena* arena) const {
  absl::MutexLock lock(&mu_);
  auto it = partner_.find(arena);
  return it == partner_.end() ? nullptr : it->second;
}

int64_t WeightArenas::HandleOf(const plane::SwapArena* arena) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [handle, a] : arenas_) {
    if (a.get() == arena) return handle;
  }
  return 0;
}

bool WeightArenas::Flipped(const plane::SwapArena* to, const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  auto it = flips_.find(to);
  if (it == flips_.end()) return false;  // freed meanwhile
  it->second->awaiting = to;
  it->second->serving = to;
  it->second->sync_id = sync_id;
  it->second->onto = to->Describe();
  return true;
}

absl::Status WeightArenas::CheckServed(const plane::SwapArena* arena, const std::string& who,
                                       const std::string& what) const {
  absl::MutexLock lock(&mu_);
  auto f = flips_.find(arena);
  if (f == flips_.end() || f->second->serving == nullptr || f->second->serving == arena) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      who, ": ", what, " lies in ", arena->Describe(), ", which the flip of sync ",
      f->second->sync_id, " left: the owner serves ", f->second->onto,
      " since, so nothing may treat the arena left as live. Register the tensors the owner "
      "serves (those FlipArenas.flip rebinds), not views of the arena it left"));
}

absl::Status WeightArenas::CheckNotLeft(const void* data, const std::string& who,
                                        const std::string& what) const {
  std::shared_ptr<plane::SwapArena> arena = Find(data, 1);
  return arena == nullptr ? absl::OkStatus() : CheckServed(arena.get(), who, what);
}

void WeightArenas::DeviceWaited(const plane::SwapArena* arena) {
  absl::MutexLock lock(&mu_);
  if (auto f = flips_.find(arena); f != flips_.end()) f->second->acked = false;
}

absl::Status WeightArenas::Ack(int64_t handle) {
  absl::MutexLock lock(&mu_);
  auto a = arenas_.find(handle);
  if (a == arenas_.end()) {
    return absl::NotFoundError(
        absl::StrCat("acknowledging a flip onto weight arena ", handle,
                     ": no arena with that handle (never created here, or freed already)"));
  }
  auto f = flips_.find(a->second.get());
  if (f == flips_.end() || f->second->awaiting != a->second.get()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "acknowledging a flip onto ", a->second->Describe(), ": no flip onto it awaits one (",
        f == flips_.end() ? "it is not one of a flip pair"
                          : "acknowledged already, or the last flip left it",
        ")"));
  }
  f->second->awaiting = nullptr;
  f->second->acked = true;
  return absl::OkStatus();
}

absl::Status WeightArenas::AwaitAck(const plane::SwapArena* arena, absl::Duration wait,
                                    const std::string& who, bool* acked) {
  absl::MutexLock lock(&mu_);
  auto f = flips_.find(arena);
  if (f == flips_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": ", arena->Describe(),
                     " is no longer of a flip pair (its owner freed it or its partner): "
                     "nothing is written into its former partner"));
  }
  std::shared_ptr<Flip> flip = f->second;
  auto done = [this, &flip]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return flip->awaiting == nullptr || closed_;
  };
  const bool answered = mu_.AwaitWithTimeout(absl::Condition(&done), wait);
  if (closed_) {
    return absl::CancelledError(absl::StrCat(who,
                                             ": stopping while awaiting the owner's "
                                             "acknowledgement of the flip of sync ",
                                             flip->sync_id, " onto ", flip->onto));
  }
  if (!answered) {
    return absl::DeadlineExceededError(
        absl::StrCat(who, ": the owner has not acknowledged the flip of sync ", flip->sync_id,
                     " onto ", flip->onto, " after ", absl::FormatDuration(wait),
                     " (AckFlip): its partner may still be read, so nothing is written into it"));
  }
  if (flips_.find(arena) == flips_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": ", arena->Describe(),
                     " stopped being of a flip pair (freed) while a sync "
                     "awaited the owner's acknowledgement of the flip of sync ",
                     flip->sync_id));
  }
  if (acked != nullptr) *acked = flip->acked;
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

void WeightArenas::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

int64_t WeightArenas::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(arenas_.size());
}

}  // namespace wsync::agent
