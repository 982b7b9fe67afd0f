#include "worker/agent/tensor_table.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "worker/agent/location_bounds.h"

namespace wsync::agent {
namespace {

std::string What(const std::string& group, const v1::TensorRegistration& t) {
  return absl::StrCat("tensor '", t.name(), "' of group '", group, "'");
}

// The bytes `t`'s dtype and shape need; errors start with `what`.
absl::StatusOr<int64_t> NeededBytes(const v1::TensorRegistration& t, const std::string& what) {
  if (t.name().empty()) return absl::InvalidArgumentError("RegisterTensors: empty tensor name");
  const int64_t es = DTypeSize(t.dtype());
  if (es == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no dtype"));
  return CheckedBytes(t.shape(), es, what);
}

bool HasLocation(const v1::TensorRegistration& t) {
  return t.has_shm() || t.has_cuda_ipc() || t.has_cuda_vmm();
}

int64_t RangeBytes(const v1::TensorRegistration& t) {
  if (t.has_shm()) return t.shm().size();
  return t.has_cuda_ipc() ? t.cuda_ipc().size() : t.cuda_vmm().size();
}

}  // namespace

absl::Status TensorTable::CheckGroup(const std::string& group) const {
  if (std::find(groups_.begin(), groups_.end(), group) != groups_.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("RegisterTensors: this worker is not in group '", group,
                   "' (its groups: ", absl::StrJoin(groups_, ", "), ")"));
}

absl::Status TensorTable::CheckConflict(const TensorEntry& e, bool replace) const {
  if (replace) return absl::OkStatus();
  auto it = tensors_.find({e.group, e.reg.name()});
  if (it == tensors_.end()) return absl::OkStatus();
  const TensorEntry& old = it->second;
  const bool same = old.reg.SerializeAsString() == e.reg.SerializeAsString() &&
                    (HasLocation(e.reg) || (old.data == e.data && old.bytes == e.bytes));
  if (same) return absl::OkStatus();
  return absl::AlreadyExistsError(
      absl::StrCat(What(e.group, e.reg), " is already registered with another location or shape"));
}

namespace {
bool ProcessAlive(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}
}  // namespace

absl::Status TensorTable::CheckOwners(const std::string& group,
                                      const std::vector<std::string>& names, bool replace,
                                      const Registrant& who) const {
  if (who.admin) return absl::OkStatus();
  for (const auto& [key, e] : tensors_) {
    if (key.first != group || e.owner_pid == who.pid) continue;
    if (!replace && std::find(names.begin(), names.end(), key.second) == names.end()) continue;
    if (!ProcessAlive(e.owner_pid)) continue;  // its owner is gone: a restarted owner takes over
    return absl::PermissionDeniedError(
        absl::StrCat(What(group, e.reg), " was registered by process ", e.owner_pid,
                     ", which is still running; only it may replace or re-register it (process ",
                     who.pid, " asked", replace ? ", replace=true" : "",
                     "), or a uid of the worker's --local_admin_uids"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterTensorsResponse> TensorTable::Register(
    const v1::RegisterTensorsRequest& req, const FdBatches& fds, const Registrant& who) {
  RETURN_IF_ERROR(CheckGroup(req.group()));
  // Validate and map everything first: a bad entry changes nothing.
  std::vector<TensorEntry> fresh;
  absl::MutexLock lock(&mu_);
  {
    std::vector<std::string> names;
    for (const v1::TensorRegistration& t : req.tensors()) names.push_back(t.name());
    RETURN_IF_ERROR(CheckOwners(req.group(), names, req.replace(), who));
  }
  for (const v1::TensorRegistration& t : req.tensors()) {
    const std::string what = What(req.group(), t);
    absl::StatusOr<int64_t> needed = NeededBytes(t, what);
    if (!needed.ok()) return needed.status();
    TensorEntry e;
    e.group = req.group();
    e.owner_pid = who.pid;
    e.reg = t;
    RETURN_IF_ERROR(CheckConflict(e, req.replace()));
    plane::BufferLocation where;
    if (t.has_shm()) where.shm = &t.shm();
    if (t.has_cuda_ipc()) where.cuda_ipc = &t.cuda_ipc();
    if (t.has_cuda_vmm()) {
      where.cuda_vmm = &t.cuda_vmm();
      auto batch = fds.find(t.cuda_vmm().fd_token());
      if (batch == fds.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": no descriptors for token '", t.cuda_vmm().fd_token(),
                         "' (send them to the worker's descriptor socket first; docs/api.md)"));
      }
      where.fds = batch->second.get();
    }
    RETURN_IF_ERROR(CheckLocationRange(where, *needed, what));
    auto opened = backend_->OpenBuffer(where, *needed, /*peer=*/false, what, &mappings_);
    if (!opened.ok()) return opened.status();
    e.data = opened->data;
    e.hold = std::move(opened->hold);
    e.identity = std::move(opened->identity);
    e.bytes = RangeBytes(t);
    fresh.push_back(std::move(e));
  }
  return Commit(req.group(), std::move(fresh), req.replace());
}

absl::StatusOr<v1::RegisterTensorsResponse> TensorTable::RegisterLocal(
    const std::string& group, std::vector<LocalTensor> tensors, bool replace) {
  RETURN_IF_ERROR(CheckGroup(group));
  std::vector<TensorEntry> fresh;
  absl::MutexLock lock(&mu_);
  for (LocalTensor& t : tensors) {
    const std::string what = What(group, t.reg);
    if (HasLocation(t.reg)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a tensor registered by pointer names no shm / CUDA location"));
    }
    absl::StatusOr<int64_t> needed = NeededBytes(t.reg, what);
    if (!needed.ok()) return needed.status();
    if (t.space != backend_->memory_space()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": its memory is ", t.space == plane::MemorySpace::kHost ? "host" : "device",
          " memory, the worker's backend (", backend_->Name(), ") moves ",
          backend_->memory_space() == plane::MemorySpace::kHost ? "host" : "device", " memory"));
    }
    if (t.data == nullptr && *needed > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": null data pointer"));
    }
    if (t.bytes < *needed) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", t.bytes, " bytes cannot hold its dtype and shape (", *needed, " bytes)"));
    }
    TensorEntry e;
    e.group = group;
    e.owner_pid = static_cast<int64_t>(::getpid());  // the owner is this process
    e.reg = std::move(t.reg);
    e.data = t.data;
    e.bytes = t.bytes;
    e.hold = std::move(t.hold);
    RETURN_IF_ERROR(CheckConflict(e, replace));
    fresh.push_back(std::move(e));
  }
  return Commit(group, std::move(fresh), replace);
}

v1::RegisterTensorsResponse TensorTable::Commit(const std::string& group,
                                                std::vector<TensorEntry> fresh, bool replace) {
  if (replace) {
    for (auto it = tensors_.begin(); it != tensors_.end();) {
      it = it->first.first == group ? tensors_.erase(it) : std::next(it);
    }
  }
  for (TensorEntry& e : fresh) {
    tensors_[{e.group, e.reg.name()}] = std::move(e);
  }
  // Mappings no entry holds any more (a snapshot may still: it keeps the
  // object alive, and the next registration maps it afresh).
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    it = it->second.expired() ? mappings_.erase(it) : std::next(it);
  }
  ++version_;
  v1::RegisterTensorsResponse resp;
  for (const auto& [key, e] : tensors_) {
    if (key.first != group) continue;
    resp.set_num_tensors(resp.num_tensors() + 1);
    resp.set_bytes(resp.bytes() + e.bytes);
  }
  return resp;
}
size_t TensorTable::mapping_count() const {
  absl::MutexLock lock(&mu_);
  return mappings_.size();
}

int64_t TensorTable::Rebase(const void* from, int64_t bytes, void* to,
                            const std::shared_ptr<void>& hold) {
  const auto begin = reinterpret_cast<uintptr_t>(from);
  if (bytes <= 0 || begin > UINTPTR_MAX - static_cast<uint64_t>(bytes)) return 0;
  const uintptr_t end = begin + static_cast<uint64_t>(bytes);
  absl::MutexLock lock(&mu_);
  int64_t moved = 0;
  for (auto& [key, e] : tensors_) {
    const auto at = reinterpret_cast<uintptr_t>(e.data);
    if (at < begin || at >= end || e.bytes < 0 || static_cast<uint64_t>(e.bytes) > end - at) {
      continue;
    }
    e.data = static_cast<uint8_t*>(to) + (at - begin);
    e.arena_hold = hold;
    ++moved;
  }
  if (moved > 0) ++version_;
  return moved;
}

TensorSnapshot TensorTable::Snapshot() const {
  absl::MutexLock lock(&mu_);
  TensorSnapshot s;
  s.version = version_;
  for (const auto& [key, e] : tensors_) s.tensors.push_back(e);
  return s;
}

v1::BufferInfo TensorTable::InfoOf(const TensorEntry& e) {
  v1::BufferInfo info;
  info.set_group(e.group);
  info.set_name(e.reg.name());
  info.set_dtype(e.reg.dtype());
  *info.mutable_shape() = e.reg.shape();
  info.set_bytes(e.bytes);
  // Where it lives, for peers that write it directly (see controller.proto).
  if (e.reg.has_shm()) *info.mutable_shm() = e.reg.shm();
  if (e.reg.has_cuda_ipc()) *info.mutable_cuda_ipc() = e.reg.cuda_ipc();
  return info;
}

std::vector<v1::BufferInfo> TensorTable::BufferInfos() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::BufferInfo> out;
  for (const auto& [key, e] : tensors_) out.push_back(InfoOf(e));
  return out;
}

uint64_t TensorTable::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

}  // namespace wsync::agent
