#include "worker/agent/shadow_set.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace wsync::agent {
namespace {

exec::StridedView Bytes(void* data, int64_t bytes) {
  exec::StridedView v;
  v.data = data;
  v.dtype = v1::UINT8;
  v.ndim = 1;
  v.shape[0] = bytes;
  v.strides[0] = 1;
  return v;
}

const char* ModeName(v1::StagingMode mode) {
  return mode == v1::STAGING_HOST_SHADOW ? "host_shadow" : "device_shadow";
}

}  // namespace

ShadowSet::ShadowSet(plane::Backend* backend, int64_t budget_bytes)
    : backend_(backend), budget_bytes_(budget_bytes) {}

absl::Status ShadowSet::EnsureOps() {
  if (ops_ != nullptr) return absl::OkStatus();
  auto ops = backend_->NewDataOps();
  if (!ops.ok()) return ops.status();
  ops_ = std::move(*ops);
  return absl::OkStatus();
}

void ShadowSet::Clear() {
  shadows_.clear();
  registry_ = exec::BufferRegistry();
  bytes_ = 0;
  live_generation_ = 0;
  dirty_ = false;
}

absl::Status ShadowSet::Prepare(const std::map<std::string, int64_t>& extents, v1::StagingMode mode,
                                const exec::BufferRegistry& live, const std::string& who) {
  if (mode != v1::STAGING_HOST_SHADOW && mode != v1::STAGING_DEVICE_SHADOW) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": staging mode ", mode, " has no shadow"));
  }
  int64_t total = 0;
  for (const auto& [name, bytes] : extents) total += bytes;
  if (budget_bytes_ > 0 && total > budget_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": a staged sync (", ModeName(mode), ") needs ", total,
        " bytes of shadow memory, over this worker's --staging_budget_bytes=", budget_bytes_));
  }
  bool same =
      mode == mode_ && live.generation() == live_generation_ && shadows_.size() == extents.size();
  for (auto it = extents.begin(); same && it != extents.end(); ++it) {
    auto s = shadows_.find(it->first);
    same = s != shadows_.end() && s->second.bytes == it->second;
  }
  if (same) {
    if (dirty_) RETURN_IF_ERROR(CopyAll(/*to_live=*/false));
    dirty_ = false;
    return absl::OkStatus();
  }
  Clear();
  RETURN_IF_ERROR(EnsureOps());
  exec::BufferRegistry reg = live;
  for (const auto& [name, bytes] : extents) {
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
  absl::Status s = CopyAll(/*to_live=*/false);
  if (!s.ok()) {
    Clear();
    return absl::Status(s.code(), absl::StrCat(who, ": filling the shadows: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ShadowSet::CopyAll(bool to_live) {
  if (shadows_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(EnsureOps());
  std::vector<exec::CopyItem> items;
  std::vector<const std::string*> names;
  for (const auto& [name, s] : shadows_) {
    if (s.bytes == 0) continue;
    exec::CopyItem item;
    item.src = Bytes(to_live ? s.memory.data() : s.live.data, s.bytes);
    item.dst = Bytes(to_live ? s.live.data : s.memory.data(), s.bytes);
    items.push_back(item);
    names.push_back(&name);
  }
  absl::Status st = ops_->Copy(items);
  if (st.ok()) st = ops_->Synchronize();
  if (!st.ok()) {
    const int64_t i = exec::ErrorItemIndex(st);
    return absl::Status(st.code(),
                        absl::StrCat(to_live ? "commit (shadow -> live)" : "fill (live -> shadow)",
                                     i >= 0 && i < static_cast<int64_t>(names.size())
                                         ? absl::StrCat(" of '", *names[i], "'")
                                         : "",
                                     ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status ShadowSet::Commit() {
  RETURN_IF_ERROR(CopyAll(/*to_live=*/true));
  dirty_ = false;
  return absl::OkStatus();
}

}  // namespace wsync::agent
