#include "worker/agent/tensor_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"

namespace wsync::agent {

absl::StatusOr<v1::RegisterTensorsResponse> TensorTable::Register(
    const v1::RegisterTensorsRequest& req) {
  if (std::find(groups_.begin(), groups_.end(), req.group()) == groups_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterTensors: this worker is not in group '", req.group(),
                     "' (its groups: ", absl::StrJoin(groups_, ", "), ")"));
  }
  // Validate and map everything first: a bad entry changes nothing.
  std::vector<TensorEntry> fresh;
  absl::MutexLock lock(&mu_);
  for (const v1::TensorRegistration& t : req.tensors()) {
    const std::string what = absl::StrCat("tensor '", t.name(), "' of group '", req.group(), "'");
    if (t.name().empty()) return absl::InvalidArgumentError("RegisterTensors: empty tensor name");
    const int64_t es = DTypeSize(t.dtype());
    if (es == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no dtype"));
    int64_t elements = 1;
    for (int64_t d : t.shape()) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative dimension"));
      if (__builtin_mul_overflow(elements, d, &elements)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": shape [", absl::StrJoin(t.shape(), ", "), "] overflows 64-bit sizes"));
      }
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(elements, es, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape [",
                                                     absl::StrJoin(t.shape(), ", "), "] of ", es,
                                                     "-byte elements overflows 64-bit sizes"));
    }
    if (!req.replace()) {
      auto it = tensors_.find({req.group(), t.name()});
      if (it != tensors_.end() && it->second.reg.SerializeAsString() != t.SerializeAsString()) {
        return absl::AlreadyExistsError(
            absl::StrCat(what, " is already registered with another location or shape"));
      }
    }
    plane::BufferLocation where;
    if (t.has_shm()) where.shm = &t.shm();
    if (t.has_cuda_ipc()) where.cuda_ipc = &t.cuda_ipc();
    auto opened = backend_->OpenBuffer(where, bytes, /*peer=*/false, what, &mappings_);
    if (!opened.ok()) return opened.status();
    TensorEntry e;
    e.group = req.group();
    e.reg = t;
    e.data = opened->data;
    e.hold = std::move(opened->hold);
    e.identity = std::move(opened->identity);
    e.bytes = t.has_shm() ? t.shm().size() : t.cuda_ipc().size();
    fresh.push_back(std::move(e));
  }
  if (req.replace()) {
    for (auto it = tensors_.begin(); it != tensors_.end();) {
      it = it->first.first == req.group() ? tensors_.erase(it) : std::next(it);
    }
  }
  for (TensorEntry& e : fresh) {
    tensors_[{e.group, e.reg.name()}] = std::move(e);
  }
  ++version_;
  v1::RegisterTensorsResponse resp;
  for (const auto& [key, e] : tensors_) {
    if (key.first != req.group()) continue;
    resp.set_num_tensors(resp.num_tensors() + 1);
    resp.set_bytes(resp.bytes() + e.bytes);
  }
  return resp;
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
