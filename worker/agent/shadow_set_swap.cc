// ShadowSet's swap commits (docs/commit-swap.md): the shadow of a part whose
// destinations all lie in one weight arena is a twin of that arena; the
// commit exchanges the two arenas' memory.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/agent/shadow_set.h"
#include "worker/agent/shadow_views.h"
#include "worker/agent/swap_runs.h"

namespace wsync::agent {
namespace {

using shadow_views::Bytes;
using shadow_views::ModeName;

// Offset of `p` in `arena` (it lies inside).
int64_t OffsetIn(const plane::SwapArena& arena, const void* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) -
                              reinterpret_cast<uintptr_t>(arena.base()));
}

}  // namespace

absl::Status ShadowSet::CheckArenasUsable(const std::map<std::string, BufferWrites>& writes,
                                          const exec::BufferRegistry& live,
                                          const std::string& who) const {
  if (arenas_ == nullptr) return absl::OkStatus();
  for (const auto& [name, w] : writes) {
    const exec::RegisteredBuffer* b = live.Find(exec::BufferSide::kDestination, name);
    if (b == nullptr) continue;  // Prepare names it
    RETURN_IF_ERROR(
        arenas_->CheckUsable(b->data, who, absl::StrCat("destination buffer '", name, "'")));
  }
  return absl::OkStatus();
}

std::shared_ptr<plane::SwapArena> ShadowSet::SwapArenaFor(
    const std::map<std::string, BufferWrites>& writes, v1::StagingMode mode,
    const exec::BufferRegistry& live, std::string* why) const {
  if (arenas_ == nullptr || writes.empty()) return nullptr;
  std::shared_ptr<plane::SwapArena> arena;
  for (const auto& [name, w] : writes) {
    const exec::RegisteredBuffer* b = live.Find(exec::BufferSide::kDestination, name);
    if (b == nullptr || b->bytes < w.extent) return nullptr;  // the copy path names it
    if (arena == nullptr) {
      arena = arenas_->Find(b->data, w.extent);
      if (arena == nullptr) return nullptr;
    } else if (!arena->Contains(b->data, w.extent)) {
      return nullptr;
    }
  }
  // Every view's runs can be listed (swap_runs.h: within the extents, not
  // too many, not too small); else the copy commit, saying why.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const auto& [name, w] : writes) {
    for (size_t i = 0; i < w.views.size(); ++i) {
      if (absl::Status s = AppendSwapRuns(w.views[i], w.extent, &runs); !s.ok()) {
        *why = absl::StrCat("view ", i, " of '", name, "' in ", arena->Describe(),
                            " does not list as byte runs for a swap: ", s.message());
        return nullptr;
      }
    }
  }
  // A host arena holds host memory: any shadow mode swaps it; a device
  // arena swaps for device_shadow only (host_shadow asks for host memory).
  if (mode == v1::STAGING_HOST_SHADOW && arena->device() >= 0) return nullptr;
  return arena;
}

absl::Status ShadowSet::PrepareSwap(const std::map<std::string, BufferWrites>& writes,
                                    v1::StagingMode mode, const exec::BufferRegistry& live,
                                    const std::string& who,
                                    std::shared_ptr<plane::SwapArena> arena) {
  if (budget_bytes_ > 0 && arena->bytes() > budget_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": a staged sync (", ModeName(mode), ", swap commit) needs a twin of ",
        arena->Describe(), ": ", arena->bytes(),
        " bytes of shadow memory, over this worker's --staging_budget_bytes=", budget_bytes_));
  }
  bool same = twin_ != nullptr && arena_ == arena && mode == mode_ &&
              live.generation() == live_generation_ && twin_extents_.size() == writes.size();
  for (auto it = writes.begin(); same && it != writes.end(); ++it) {
    auto e = twin_extents_.find(it->first);
    same = e != twin_extents_.end() && e->second == it->second.extent;
  }
  who_ = who;
  if (!same) {
    Clear();
    arena_ = std::move(arena);
    mode_ = mode;
    if (absl::Status s = MakeTwin(writes, live, who); !s.ok()) {
      Clear();
      return s;
    }
  }
  // A Discard needs no refill: the commit copies every byte the part does
  // not write, and the part writes the others again (see MakeTwin).
  dirty_ = false;
  return PlanSwapCommit(writes, live, who);
}

absl::Status ShadowSet::MakeTwin(const std::map<std::string, BufferWrites>& writes,
                                 const exec::BufferRegistry& live, const std::string& who) {
  RETURN_IF_ERROR(EnsureOps());
  auto twin = arena_->NewTwin(absl::StrCat(who, " twin"));
  if (!twin.ok()) {
    return absl::Status(twin.status().code(),
                        absl::StrCat(who, ": the twin of ", arena_->Describe(),
                                     " for a swap commit: ", twin.status().message()));
  }
  twin_ = std::move(*twin);
  RETURN_IF_ERROR(PointDestinationsAt(writes, live, twin_->base()));
  bytes_ = twin_->bytes();
  // Whole, once, so the twin starts as a copy of live. It does not stay
  // one: after a swap it holds V-1 (the old live memory), after a rollback
  // part of the discarded version. Neither reaches live: each sync writes
  // every byte of its views, and the commit copies every other arena byte
  // live -> twin (PlanSwapCommit), whatever views the previous sync wrote
  // (tests: SyncsWritingDifferentViewsKeepEveryByteOfTheLastVersion). A
  // plan that READ a destination byte before writing it in the same sync
  // would see the stale bytes; none does (a reduce reads its inputs from
  // staging or the source and writes the destination once), and such a
  // plan would need the twin refilled from live first.
  const std::string arena_name = arena_->Describe();
  return RunCopies({exec::CopyItem{Bytes(arena_->base(), arena_->bytes()),
                                   Bytes(twin_->base(), twin_->bytes())}},
                   {&arena_name}, "filling a swap commit's twin (live -> twin)");
}

absl::Status ShadowSet::PointDestinationsAt(const std::map<std::string, BufferWrites>& writes,
                                            const exec::BufferRegistry& live, void* base) {
  exec::BufferRegistry reg = live;
  twin_extents_.clear();
  for (const auto& [name, w] : writes) {
    exec::RegisteredBuffer shadow = *live.Find(exec::BufferSide::kDestination, name);
    shadow.data = static_cast<uint8_t*>(base) + OffsetIn(*arena_, shadow.data);
    shadow.bytes = w.extent;
    RETURN_IF_ERROR(reg.Unregister(exec::BufferSide::kDestination, name));
    RETURN_IF_ERROR(reg.Register(exec::BufferSide::kDestination, name, shadow));
    twin_extents_[name] = w.extent;
  }
  registry_ = std::move(reg);
  live_generation_ = live.generation();
  return absl::OkStatus();
}

absl::Status ShadowSet::PlanSwapCommit(const std::map<std::string, BufferWrites>& writes,
                                       const exec::BufferRegistry& live, const std::string& who) {
  commit_items_.clear();
  commit_names_.clear();
  commit_bytes_ = 0;
  std::vector<std::pair<int64_t, int64_t>> written;  // arena offsets
  for (const auto& [name, w] : writes) {
    const exec::RegisteredBuffer* b = live.Find(exec::BufferSide::kDestination, name);
    if (b == nullptr) {
      return absl::InternalError(absl::StrCat(who, ": no live buffer '", name, "'"));
    }
    const int64_t base = OffsetIn(*arena_, b->data);
    const size_t first = written.size();
    for (const v1::TensorView& v : w.views) {
      if (absl::Status s = AppendSwapRuns(v, w.extent, &written); !s.ok()) {
        return absl::InternalError(absl::StrCat(who, ": a view of '", name,
                                                "' no longer lists as byte runs: ", s.message()));
      }
    }
    for (size_t i = first; i < written.size(); ++i) {
      written[i].first += base;
      written[i].second += base;
    }
  }
  std::sort(written.begin(), written.end());
  // The complement in [0, arena bytes): what survives from live.
  auto* live_base = static_cast<uint8_t*>(arena_->base());
  auto* twin_base = static_cast<uint8_t*>(twin_ != nullptr ? twin_->base() : flip_to_->base());
  int64_t at = 0;
  auto keep = [&](int64_t begin, int64_t end) {
    if (end <= begin) return;
    commit_items_.push_back(exec::CopyItem{Bytes(live_base + begin, end - begin),
                                           Bytes(twin_base + begin, end - begin)});
    commit_names_.push_back(nullptr);
    commit_bytes_ += end - begin;
  };
  for (const auto& [begin, end] : written) {
    keep(at, begin);
    at = std::max(at, end);
  }
  keep(at, arena_->bytes());
  return absl::OkStatus();
}

absl::Status ShadowSet::CommitSwap() {
  RETURN_IF_ERROR(EnsureOps());
  const std::string what = absl::StrCat(who_, ": swap commit of ", arena_->Describe());
  Lap lap;
  // The set's own copies (the twin's fill) are done before anything moves;
  // the sync's writes into the twin end with BeginSwap's wait for the device.
  if (absl::Status s = ops_->Synchronize(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": waiting for the data ops: ", s.message()));
  }
  commit_times_.wait_ops_s = lap();
  absl::Status s = RunCopies(commit_items_, commit_names_,
                             "copying the bytes the sync does not write (live -> twin)");
  commit_times_.copy_s = lap();
  const bool copied = s.ok();
  // Only the live range's remap is inside the pause; the twin's range is
  // remapped by FinishSwap, before the twin is written again.
  if (copied) {
    s = arena_->BeginSwap(*twin_);
    commit_times_.swap_s = lap();
  }
  if (s.ok()) {
    swap_unfinished_ = true;
    return s;
  }
  // Before the swap, or a swap that failed and put each range back on its
  // own memory (the seam's contract): the live arena still holds the
  // version it served, whole. An arena the swap could not put back is
  // unusable: later syncs into it are refused (CheckArenasUsable).
  const bool whole = arena_->usable();
  s = absl::Status(
      s.code(),
      absl::StrCat(what, ": ", copied ? "" : "before the swap: ", s.message(),
                   whole ? "; the live tensors keep the version they held, whole"
                         : "; the live arena is unusable now: its owner must serve nothing "
                           "from it"));
  // A twin a failed commit leaves is never reused: the next staged sync
  // makes a new one (a failed swap may have left it unmapped).
  Clear();
  return s;
}

absl::Status ShadowSet::FinishSwap() {
  if (!swap_unfinished_) return absl::OkStatus();
  swap_unfinished_ = false;
  absl::Status s = arena_->FinishSwap(*twin_);
  if (!s.ok()) Clear();  // the twin is unusable: the next staged sync makes a new one
  return s;
}

}  // namespace wsync::agent
