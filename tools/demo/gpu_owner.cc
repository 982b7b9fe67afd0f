#include "tools/demo/gpu_owner.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/ipc_registry.h"

namespace wsync::demo {
namespace {

class GpuOwnerRank : public Owner {
 public:
  GpuOwnerRank(std::string socket, std::string group, std::vector<BufferSpec> buffers, int device)
      : socket_(std::move(socket)),
        group_(std::move(group)),
        buffers_(std::move(buffers)),
        device_(device),
        stub_(LocalStub(socket_)) {}

  absl::Status Init() {
    int64_t off = 0;
    for (const BufferSpec& b : buffers_) {
      if (DTypeSize(b.dtype) == 0 || b.bytes < 0) {
        return absl::InvalidArgumentError(absl::StrCat("buffer '", b.name, "' of group '", group_,
                                                       "': no dtype or negative size"));
      }
      offsets_.push_back(off);
      off += (b.bytes + 255) / 256 * 256;
    }
    size_ = std::max<int64_t>(off, 256);
    auto mem = cuda::DeviceBuffer::Allocate(device_, static_cast<size_t>(size_));
    if (!mem.ok()) return mem.status();
    device_memory_ = *std::move(mem);
    host_.assign(static_cast<size_t>(size_), 0);
    for (size_t i = 0; i < buffers_.size(); ++i) {
      memory_[buffers_[i].name] = host_.data() + offsets_[i];
    }
    return absl::OkStatus();
  }

  absl::Status Register() override {
    v1::RegisterTensorsRequest req;
    req.set_group(group_);
    req.set_replace(true);
    char* base = static_cast<char*>(device_memory_.data());
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const BufferSpec& b = buffers_[i];
      auto h = cuda::ExportTensor(base + offsets_[i], static_cast<uint64_t>(b.bytes), b.name);
      if (!h.ok()) return h.status();
      v1::TensorRegistration* t = req.add_tensors();
      t->set_name(b.name);
      t->set_dtype(b.dtype);
      t->add_shape(b.bytes / DTypeSize(b.dtype));
      v1::CudaIpc* ipc = t->mutable_cuda_ipc();
      ipc->set_handle(h->base_handle);
      ipc->set_device(device_);
      ipc->set_offset(static_cast<int64_t>(h->offset));
      ipc->set_size(static_cast<int64_t>(h->bytes));
      ipc->set_gpu_uuid(h->gpu_uuid);
      ipc->set_base_size(static_cast<int64_t>(h->base_bytes));
    }
    return SendRegistration(*stub_, req, socket_);
  }

  const BufferMap& memory() const override { return memory_; }
  int64_t bytes() const override { return size_; }
  v1::WorkerLocal::Stub& stub() override { return *stub_; }

  // cudaMemcpy is synchronous: the writes are complete before the sync is
  // requested, which is the ordering contract an owner must keep.
  absl::Status Publish() override {
    cuda::DeviceGuard guard(device_);
    return cuda::CudaStatus(
        cudaMemcpy(device_memory_.data(), host_.data(), host_.size(), cudaMemcpyHostToDevice),
        absl::StrCat("upload of group '", group_, "' on device ", device_));
  }
  absl::Status Fetch() override {
    cuda::DeviceGuard guard(device_);
    return cuda::CudaStatus(
        cudaMemcpy(host_.data(), device_memory_.data(), host_.size(), cudaMemcpyDeviceToHost),
        absl::StrCat("download of group '", group_, "' on device ", device_));
  }

 private:
  std::string socket_;
  std::string group_;
  std::vector<BufferSpec> buffers_;
  int device_;
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
  cuda::DeviceBuffer device_memory_;
  std::vector<uint8_t> host_;
  BufferMap memory_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Owner>> CreateGpuOwner(std::string socket, std::string group,
                                                      std::vector<BufferSpec> buffers, int device) {
  auto owner = std::make_unique<GpuOwnerRank>(std::move(socket), std::move(group),
                                              std::move(buffers), device);
  absl::Status s = owner->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Owner>(std::move(owner));
}

int VisibleGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace wsync::demo
