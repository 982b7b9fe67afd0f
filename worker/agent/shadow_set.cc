#include "worker/agent/shadow_set.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/agent/shadow_views.h"

namespace wsync::agent {
using shadow_views::Bytes;
using shadow_views::Dense;
using shadow_views::ModeName;
using shadow_views::NumElements;

ShadowSet::ShadowSet(plane::Backend* backend, int64_t budget_bytes, WeightArenas* arenas)
    : backend_(backend), budget_bytes_(budget_bytes), arenas_(arenas) {}

absl::Status ShadowSet::EnsureOps() {
  if (ops_ != nullptr) return absl::OkStatus();
  auto ops = backend_->NewDataOps();
  if (!ops.ok()) return ops.status();
  ops_ = std::move(*ops);
  return absl::OkStatus();
}

void ShadowSet::Clear() {
  swap_unfinished_ = false;
  shadows_.clear();
  twin_.reset();
  flip_to_.reset();
  arena_.reset();
  twin_extents_.clear();
  registry_ = exec::BufferRegistry();
  retired_ = exec::BufferRegistry();
  bytes_ = 0;
  live_generation_ = 0;
  dirty_ = false;
  commit_items_.clear();
  commit_names_.clear();
  commit_bytes_ = 0;
}

absl::Status ShadowSet::Prepare(const std::map<std::string, BufferWrites>& writes,
                                v1::StagingMode mode, const exec::BufferRegistry& live,
                                const std::string& who) {
  if (mode != v1::STAGING_HOST_SHADOW && mode != v1::STAGING_DEVICE_SHADOW) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": staging mode ", mode, " has no shadow"));
  }
  if (absl::Status s = FinishSwap(); !s.ok()) {
    spdlog::warn("{}: {}; a new twin is made", who, std::string(s.message()));
  }
  // A failed swap that could not put an arena's memory back: never touch
  // its range again (a copy commit would fault as a swap would).
  RETURN_IF_ERROR(CheckArenasUsable(writes, live, who));
  std::string why;
  flipped_ = Flip{};
  if (std::shared_ptr<plane::SwapArena> arena = SwapArenaFor(writes, mode, live, &why)) {
    copy_reason_.clear();
    if (std::shared_ptr<plane::SwapArena> partner = arenas_->PartnerOf(arena.get())) {
      return PrepareFlip(writes, mode, live, who, std::move(arena), std::move(partner));
    }
    return PrepareSwap(writes, mode, live, who, std::move(arena));
  }
  if (why != copy_reason_ && !why.empty()) {
    spdlog::warn("{}: this staged sync commits by copy, not swap: {}", who, why);
  }
  copy_reason_ = why;
  int64_t total = 0;
  for (const auto& [name, w] : writes) total += w.extent;
  if (budget_bytes_ > 0 && total > budget_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": a staged sync (", ModeName(mode), ") needs ", total,
        " bytes of shadow memory, over this worker's --staging_budget_bytes=", budget_bytes_));
  }
  bool same = twin_ == nullptr && flip_to_ == nullptr && mode == mode_ &&
              live.generation() == live_generation_ && shadows_.size() == writes.size();
  for (auto it = writes.begin(); same && it != writes.end(); ++it) {
    auto s = shadows_.find(it->first);
    same = s != shadows_.end() && s->second.bytes == it->second.extent;
  }
  if (same) {
    if (dirty_) RETURN_IF_ERROR(Fill());
    dirty_ = false;
    return PlanCommit(writes, who);
  }
  Clear();
  RETURN_IF_ERROR(EnsureOps());
  exec::BufferRegistry reg = live;
  for (const auto& [name, w] : writes) {
    const int64_t bytes = w.extent;
    const exec::RegisteredBuffer* b = live.Find(exec::BufferSide::kDestination, name);
    if (b == nullptr || b->bytes < bytes) {
      Clear();
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the plan writes ", bytes, " bytes of destination buffer '", name, "' but ",
          b == nullptr ? "it is not registered" : absl::StrCat("it has ", b->bytes, " bytes")));
    }
    auto memory = mode == v1::STAGING_HOST_SHADOW ? ops_->AllocateHostShadow(bytes)
                                                  : ops_->AllocateStaging(bytes);
    if (!memory.ok()) {
      Clear();
      return absl::Status(memory.status().code(),
                          absl::StrCat(who, ": shadow of '", name, "' (", bytes, " bytes, ",
                                       ModeName(mode), "): ", memory.status().message()));
    }
    exec::RegisteredBuffer shadow = *b;
    shadow.data = memory->data();
    // The shadow stands in for the whole buffer: a view past the extent
    // would be a planner bug, and binding refuses it against these bytes.
    shadow.bytes = bytes;
    RETURN_IF_ERROR(reg.Unregister(exec::BufferSide::kDestination, name));
    RETURN_IF_ERROR(reg.Register(exec::BufferSide::kDestination, name, shadow));
    shadows_[name] = Shadow{*b, std::move(*memory), bytes};
    bytes_ += bytes;
  }
  registry_ = std::move(reg);
  mode_ = mode;
  live_generation_ = live.generation();
  absl::Status s = Fill();
  if (s.ok()) s = PlanCommit(writes, who);
  if (!s.ok()) {
    Clear();
    return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ShadowSet::PlanCommit(const std::map<std::string, BufferWrites>& writes,
                                   const std::string& who) {
  commit_items_.clear();
  commit_names_.clear();
  commit_bytes_ = 0;
  for (const auto& [name, w] : writes) {
    auto s = shadows_.find(name);
    if (s == shadows_.end()) {
      return absl::InternalError(absl::StrCat(who, ": no shadow of '", name, "'"));
    }
    auto* shadow = static_cast<uint8_t*>(s->second.memory.data());
    auto* live = static_cast<uint8_t*>(s->second.live.data);
    // Dense views become byte ranges, merged where they touch (a buffer
    // written whole is one copy); the others are copied as strided views.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const v1::TensorView& v : w.views) {
      const int64_t size = DTypeSize(v.dtype());
      if (Dense(v)) {
        ranges.emplace_back(v.byte_offset(), v.byte_offset() + NumElements(v) * size);
        continue;
      }
      std::vector<int64_t> shape(v.shape().begin(), v.shape().end());
      std::vector<int64_t> strides(v.strides().begin(), v.strides().end());
      auto src = exec::MakeStridedView(shadow + v.byte_offset(), v.dtype(), shape, strides);
      auto dst = exec::MakeStridedView(live + v.byte_offset(), v.dtype(), shape, strides);
      if (!src.ok() || !dst.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": commit of a view of '", name,
                         "': ", (src.ok() ? dst.status() : src.status()).message()));
      }
      commit_items_.push_back(exec::CopyItem{*src, *dst});
      commit_names_.push_back(&s->first);
      commit_bytes_ += NumElements(v) * size;
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 0; i < ranges.size();) {
      auto [begin, end] = ranges[i];
      for (++i; i < ranges.size() && ranges[i].first <= end; ++i) {
        end = std::max(end, ranges[i].second);
      }
      commit_items_.push_back(
          exec::CopyItem{Bytes(shadow + begin, end - begin), Bytes(live + begin, end - begin)});
      commit_names_.push_back(&s->first);
      commit_bytes_ += end - begin;
    }
  }
  return absl::OkStatus();
}

absl::Status ShadowSet::Fill() {
  std::vector<exec::CopyItem> items;
  std::vector<const std::string*> names;
  for (const auto& [name, s] : shadows_) {
    if (s.bytes == 0) continue;
    items.push_back(exec::CopyItem{Bytes(s.live.data, s.bytes), Bytes(s.memory.data(), s.bytes)});
    names.push_back(&name);
  }
  return RunCopies(items, names, "filling the shadows (live -> shadow)");
}

absl::Status ShadowSet::RunCopies(const std::vector<exec::CopyItem>& items,
                                  const std::vector<const std::string*>& names, const char* what) {
  if (items.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(EnsureOps());
  absl::Status st = ops_->Copy(items);
  if (st.ok()) st = ops_->Synchronize();
  if (!st.ok()) {
    const int64_t i = exec::ErrorItemIndex(st);
    return absl::Status(st.code(), absl::StrCat(what,
                                                i >= 0 && i < static_cast<int64_t>(names.size()) &&
                                                        names[i] != nullptr
                                                    ? absl::StrCat(" of '", *names[i], "'")
                                                    : "",
                                                ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status ShadowSet::Commit() {
  commit_times_ = CommitTimes{};
  flipped_ = Flip{};
  if (twin_ != nullptr) return CommitSwap();
  if (flip_to_ != nullptr) return CommitFlip();
  Lap lap;
  absl::Status s = RunCopies(commit_items_, commit_names_, "commit (shadow -> live)");
  commit_times_.copy_s = lap();
  return s;
}

}  // namespace wsync::agent
