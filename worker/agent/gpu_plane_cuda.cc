// The GPU data plane (WSYNC_WITH_CUDA builds): CUDA IPC import through
// cuda::IpcRegistry, NCCL transports, CUDA data ops.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/agent/gpu_plane.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/ipc_registry.h"
#include "worker/backends/cuda/nccl_transport.h"

namespace wsync::agent {
namespace {

class CudaGpuPlane : public GpuPlane {
 public:
  explicit CudaGpuPlane(std::unique_ptr<cuda::IpcRegistry> ipc) : ipc_(std::move(ipc)) {}

  int device() const override { return ipc_->device(); }
  const std::string& uuid() const override { return ipc_->uuid(); }

  absl::StatusOr<std::shared_ptr<void>> Open(const v1::CudaIpc& ipc,
                                             const std::string& what) override {
    return OpenHandle(ipc, what, /*peer=*/false);
  }
  absl::StatusOr<std::shared_ptr<void>> OpenPeer(const v1::CudaIpc& ipc,
                                                 const std::string& what) override {
    return OpenHandle(ipc, what, /*peer=*/true);
  }
  const std::vector<std::string>& writable_uuids() const override {
    return ipc_->writable_uuids();
  }
  int64_t slow_peer_mappings() const override { return ipc_->slow_peer_mappings(); }

 private:
  absl::StatusOr<std::shared_ptr<void>> OpenHandle(const v1::CudaIpc& ipc, const std::string& what,
                                                   bool peer) {
    if (ipc.offset() < 0 || ipc.size() < 0 || ipc.base_size() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": CUDA IPC range offset ", ipc.offset(), ", size ", ipc.size(),
                       " in an allocation of ", ipc.base_size(),
                       " bytes (base_size must be the allocation's size)"));
    }
    cuda::IpcTensorHandle h;
    h.gpu_uuid = ipc.gpu_uuid();
    h.base_handle = ipc.handle();
    h.base_bytes = static_cast<uint64_t>(ipc.base_size());
    h.offset = static_cast<uint64_t>(ipc.offset());
    h.bytes = static_cast<uint64_t>(ipc.size());
    auto data = ipc_->Open(h, what, peer);
    if (!data.ok()) return data.status();
    // The registry outlives every tensor entry (both die with the worker's
    // GPU plane, entries first).
    cuda::IpcRegistry* registry = ipc_.get();
    return std::shared_ptr<void>(*data, [registry, h](void*) { registry->Release(h); });
  }

 public:
  absl::StatusOr<std::unique_ptr<exec::DataOps>> NewDataOps() override {
    cuda::CudaDataOps::Options options;
    options.device = device();
    auto ops = cuda::CudaDataOps::Create(options);
    if (!ops.ok()) return ops.status();
    return std::unique_ptr<exec::DataOps>(std::move(*ops));
  }

  absl::StatusOr<std::unique_ptr<transport::Transport>> Connect(
      transport::KvStore& store, const std::string& prefix, int32_t rank, int32_t size,
      absl::Time deadline, const std::atomic<bool>* cancel) override {
    transport::NcclTransportOptions o;
    o.device = device();
    o.rank = rank;
    o.size = size;
    o.init_timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    o.cancel = cancel;
    auto t = transport::NcclTransport::Create(store, prefix, o);
    if (!t.ok()) return t.status();
    return std::unique_ptr<transport::Transport>(std::move(*t));
  }

 private:
  std::unique_ptr<cuda::IpcRegistry> ipc_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuPlane>> CreateGpuPlane(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", device,
                     ": no usable GPU (cudaGetDeviceCount: ", cudaGetErrorString(err), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", device, ": this process sees ", count, " GPU(s)"));
  }
  auto ipc = cuda::IpcRegistry::Create(device);
  if (!ipc.ok()) return ipc.status();
  return std::make_unique<CudaGpuPlane>(std::move(*ipc));
}

}  // namespace wsync::agent
