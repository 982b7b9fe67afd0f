#include "worker/agent/tensor_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"

namespace wsync::agent {

absl::StatusOr<std::shared_ptr<ShmMapping>> ShmMapping::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("shm_open('", name, "'): ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of shm '", name, "': ", std::strerror(err)));
  }
  if (st.st_size <= 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shm '", name, "' is empty"));
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping stays valid without the descriptor
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of shm '", name, "': ", std::strerror(err)));
  }
  return std::shared_ptr<ShmMapping>(new ShmMapping(name, absl::StrCat(st.st_dev, ":", st.st_ino),
                                                    static_cast<uint8_t*>(p),
                                                    static_cast<int64_t>(st.st_size)));
}

ShmMapping::~ShmMapping() { munmap(data_, static_cast<size_t>(size_)); }

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
  std::map<std::string, std::shared_ptr<ShmMapping>> opened;
  for (const v1::TensorRegistration& t : req.tensors()) {
    const std::string what = absl::StrCat("tensor '", t.name(), "' of group '", req.group(), "'");
    if (t.name().empty()) return absl::InvalidArgumentError("RegisterTensors: empty tensor name");
    const int64_t es = DTypeSize(t.dtype());
    if (es == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no dtype"));
    int64_t elements = 1;
    for (int64_t d : t.shape()) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative dimension"));
      elements *= d;
    }
    if (!req.replace()) {
      auto it = tensors_.find({req.group(), t.name()});
      if (it != tensors_.end() && it->second.reg.SerializeAsString() != t.SerializeAsString()) {
        return absl::AlreadyExistsError(
            absl::StrCat(what, " is already registered with another location or shape"));
      }
    }
    if (t.has_cuda_ipc()) {
      if (gpu_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(what,
                         ": CUDA IPC buffers need a worker with the GPU data plane (wsync-worker "
                         "--device N, built with WSYNC_WITH_CUDA); this one moves host memory"));
      }
      const v1::CudaIpc& ipc = t.cuda_ipc();
      if (ipc.size() < elements * es) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": CUDA IPC range of ", ipc.size(),
                                                       " bytes cannot hold ", elements,
                                                       " elements of ", DTypeName(t.dtype())));
      }
      auto data = gpu_->Open(ipc, what);
      if (!data.ok()) return data.status();
      TensorEntry e;
      e.group = req.group();
      e.reg = t;
      e.on_device = true;
      e.device_memory = *data;
      e.data = e.device_memory.get();
      e.bytes = ipc.size();
      fresh.push_back(std::move(e));
      continue;
    }
    if (!t.has_shm()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": no location (shm) given"));
    }
    if (gpu_ != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": this worker runs the GPU data plane on device ", gpu_->device(),
                       " (", gpu_->uuid(), "); register device tensors (cuda_ipc), not shm"));
    }
    const v1::HostShm& shm = t.shm();
    if (shm.offset() < 0 || shm.size() < elements * es) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shm range [", shm.offset(), ", +",
                                                     shm.size(), ") cannot hold ", elements,
                                                     " elements of ", DTypeName(t.dtype())));
    }
    std::shared_ptr<ShmMapping> mapping;
    if (auto it = opened.find(shm.name()); it != opened.end()) {
      mapping = it->second;
    } else if (auto wit = mappings_.find(shm.name()); wit != mappings_.end()) {
      mapping = wit->second.lock();
    }
    if (mapping == nullptr) {
      auto m = ShmMapping::Open(shm.name());
      if (!m.ok())
        return absl::Status(m.status().code(), absl::StrCat(what, ": ", m.status().message()));
      mapping = *m;
    }
    opened[shm.name()] = mapping;
    if (shm.offset() + shm.size() > mapping->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": shm '", shm.name(), "' has ", mapping->size(), " bytes, the tensor needs [",
          shm.offset(), ", ", shm.offset() + shm.size(), ")"));
    }
    TensorEntry e;
    e.group = req.group();
    e.reg = t;
    e.mapping = mapping;
    e.data = mapping->data() + shm.offset();
    e.bytes = shm.size();
    fresh.push_back(std::move(e));
  }
  if (req.replace()) {
    for (auto it = tensors_.begin(); it != tensors_.end();) {
      it = it->first.first == req.group() ? tensors_.erase(it) : std::next(it);
    }
  }
  for (TensorEntry& e : fresh) {
    if (e.mapping != nullptr) mappings_[e.mapping->name()] = e.mapping;
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
