#include "tools/demo/owner.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "grpcpp/grpcpp.h"

namespace wsync::demo {

absl::StatusOr<std::unique_ptr<OwnerRank>> OwnerRank::Create(std::string socket, std::string group,
                                                             std::vector<BufferSpec> buffers,
                                                             std::string shm_name) {
  std::unique_ptr<OwnerRank> o(new OwnerRank());
  o->socket_ = std::move(socket);
  o->group_ = std::move(group);
  o->buffers_ = std::move(buffers);
  o->shm_name_ = std::move(shm_name);
  int64_t off = 0;
  for (const BufferSpec& b : o->buffers_) {
    o->offsets_.push_back(off);
    off += (b.bytes + 63) / 64 * 64;
  }
  o->size_ = std::max<int64_t>(off, 64);
  const int fd = shm_open(o->shm_name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("shm_open('", o->shm_name_, "'): ", std::strerror(errno)));
  }
  if (ftruncate(fd, o->size_) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(o->shm_name_.c_str());
    return absl::InternalError(
        absl::StrCat("ftruncate('", o->shm_name_, "', ", o->size_, "): ", std::strerror(err)));
  }
  void* p = mmap(nullptr, o->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(o->shm_name_.c_str());
    return absl::InternalError(absl::StrCat("mmap('", o->shm_name_, "'): ", std::strerror(errno)));
  }
  o->base_ = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < o->buffers_.size(); ++i) {
    o->memory_[o->buffers_[i].name] = o->base_ + o->offsets_[i];
  }
  o->stub_ = LocalStub(o->socket_);
  return o;
}

OwnerRank::~OwnerRank() {
  if (base_ != nullptr) munmap(base_, size_);
  shm_unlink(shm_name_.c_str());
}

v1::RegisterTensorsRequest OwnerRank::Request() const {
  v1::RegisterTensorsRequest req;
  req.set_group(group_);
  req.set_replace(true);
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const BufferSpec& b = buffers_[i];
    v1::TensorRegistration* t = req.add_tensors();
    t->set_name(b.name);
    t->set_dtype(b.dtype);
    t->add_shape(b.bytes / DTypeSize(b.dtype));
    t->mutable_shm()->set_name(shm_name_);
    t->mutable_shm()->set_offset(offsets_[i]);
    t->mutable_shm()->set_size(b.bytes);
  }
  return req;
}

absl::Status OwnerRank::Register() { return SendRegistration(*stub_, Request(), socket_); }

std::unique_ptr<v1::WorkerLocal::Stub> LocalStub(const std::string& socket) {
  return v1::WorkerLocal::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

absl::Status SendRegistration(v1::WorkerLocal::Stub& stub, const v1::RegisterTensorsRequest& req,
                              const std::string& socket) {
  // A worker restarted under the same socket: the channel may still hold the
  // dead process's connection, and the first call on it fails UNAVAILABLE
  // ("Broken pipe") before the channel reconnects. Registering again is safe
  // (the request replaces).
  grpc::Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);  // the worker may still be starting
    v1::RegisterTensorsResponse resp;
    s = stub.RegisterTensors(&ctx, req, &resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || !req.replace()) break;
  }
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("RegisterTensors (group '", req.group(), "', socket ", socket,
                                     "): ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace wsync::demo
