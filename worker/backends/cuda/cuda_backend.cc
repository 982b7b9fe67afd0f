#include "worker/backends/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_peer_writer.h"
#include "worker/backends/cuda/cuda_swap_arena.h"
#include "worker/backends/cuda/nccl_transport.h"
#include "worker/backends/cuda/vmm_import.h"
#include "worker/plane/memory_domain.h"

namespace wsync::cuda {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                                 CudaDataOps::Options ops_options) {
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
  ASSIGN_OR_RETURN(std::unique_ptr<IpcRegistry> ipc, IpcRegistry::Create(device));
  ops_options.device = device;
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(ipc), ops_options));
}

std::vector<std::string> CudaBackend::capabilities() const {
  std::vector<std::string> caps = {"cuda_ipc", "cuda_vmm"};
  int version = 0;
  if (ncclGetVersion(&version) == ncclSuccess && version > 0) {
    // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9,
    // major * 1000 + minor * 100 + patch before.
    const int major_unit = version >= 10000 ? 10000 : 1000;
    caps.push_back(absl::StrCat("nccl=", version / major_unit, ".", version % major_unit / 100, ".",
                                version % 100));
  }
  return caps;
}

std::string CudaBackend::Name() const { return absl::StrCat("cuda:", device()); }

absl::StatusOr<plane::OpenedBuffer> CudaBackend::OpenBuffer(const plane::BufferLocation& where,
                                                            int64_t bytes, bool peer,
                                                            const std::string& what,
                                                            plane::MappingCache* cache) {
  if (where.cuda_vmm != nullptr) return OpenVmm(where, bytes, peer, what, cache);
  if (where.shm != nullptr) {
    return absl::FailedPreconditionError(
        peer ? absl::StrCat(what, ": host memory, but this worker moves device memory")
             : absl::StrCat(what, ": this worker runs the GPU data plane on device ", device(),
                            " (", ipc_->uuid(), "); register device tensors (cuda_ipc), not shm"));
  }
  if (where.cuda_ipc == nullptr) {
    return absl::InvalidArgumentError(
        peer ? absl::StrCat(what,
                            ": no location (the peer's worker predates direct writes or did not "
                            "report it)")
             : absl::StrCat(what, ": no location (cuda_ipc) given"));
  }
  const v1::CudaIpc& ipc = *where.cuda_ipc;
  if (ipc.offset() < 0 || ipc.size() < 0 || ipc.base_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": CUDA IPC range offset ", ipc.offset(), ", size ", ipc.size(),
                     " in an allocation of ", ipc.base_size(),
                     " bytes (base_size must be the allocation's size)"));
  }
  if (bytes < 0 || bytes > ipc.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": CUDA IPC range of ", ipc.size(),
                                                   " bytes cannot hold ", bytes, " bytes"));
  }
  IpcTensorHandle h;
  h.gpu_uuid = ipc.gpu_uuid();
  h.base_handle = ipc.handle();
  h.base_bytes = static_cast<uint64_t>(ipc.base_size());
  h.offset = static_cast<uint64_t>(ipc.offset());
  h.bytes = static_cast<uint64_t>(ipc.size());
  ASSIGN_OR_RETURN(void* data, ipc_->Open(h, what, peer));
  // The registry outlives every buffer (the worker's tensors and peer maps
  // die before its backend).
  IpcRegistry* registry = ipc_.get();
  plane::OpenedBuffer out;
  out.data = data;
  out.hold = std::shared_ptr<void>(data, [registry, h](void*) { registry->Release(h); });
  return out;
}

absl::StatusOr<plane::OpenedBuffer> CudaBackend::OpenVmm(const plane::BufferLocation& where,
                                                         int64_t bytes, bool peer,
                                                         const std::string& what,
                                                         plane::MappingCache* cache) {
  const v1::CudaVmm& vmm = *where.cuda_vmm;
  if (peer || where.fds == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": CUDA virtual memory opens only from its owner's descriptors, not as a peer's "
        "buffer"));
  }
  if (vmm.gpu_uuid() != ipc_->uuid()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " lives on ", vmm.gpu_uuid(),
                                                   " but this worker maps device ", device(), " (",
                                                   ipc_->uuid(), ")"));
  }
  if (bytes < 0 || bytes > vmm.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": CUDA virtual memory range of ",
                                                   vmm.size(), " bytes cannot hold ", bytes,
                                                   " bytes"));
  }
  // Tensors over the same chunks of one batch share a mapping.
  std::string key = absl::StrCat("vmm:", vmm.fd_token());
  for (const v1::CudaVmm::Chunk& c : vmm.chunks())
    absl::StrAppend(&key, ":", c.fd_index(), "+", c.bytes());
  std::shared_ptr<VmmMapping> mapping;
  if (cache != nullptr) {
    auto it = cache->find(key);
    if (it != cache->end()) mapping = std::static_pointer_cast<VmmMapping>(it->second.lock());
  }
  if (mapping == nullptr) {
    ASSIGN_OR_RETURN(mapping, VmmMapping::Map(device(), vmm, *where.fds, what));
    if (cache != nullptr) (*cache)[key] = mapping;
  } else {
    // The checks Map makes, for this tensor's range.
    RETURN_IF_ERROR(VmmRangeBytes(vmm, *where.fds, 1, what).status());
  }
  plane::OpenedBuffer out;
  out.data = static_cast<char*>(mapping->base()) + vmm.offset();
  out.hold = mapping;
  return out;
}

absl::StatusOr<std::unique_ptr<exec::DataOps>> CudaBackend::NewDataOps() {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDataOps> ops, CudaDataOps::Create(ops_options_));
  return std::unique_ptr<exec::DataOps>(std::move(ops));
}

absl::StatusOr<std::unique_ptr<transport::Transport>> CudaBackend::Connect(
    const plane::ConnectOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("NCCL transport: no rendezvous store");
  }
  transport::NcclTransportOptions o;
  o.device = device();
  o.rank = options.rank;
  o.size = options.size;
  o.init_timeout = std::max(absl::Milliseconds(1), options.deadline - absl::Now());
  o.cancel = options.cancel;
  ASSIGN_OR_RETURN(std::unique_ptr<transport::NcclTransport> t,
                   transport::NcclTransport::Create(*options.store, options.prefix, o));
  return std::unique_ptr<transport::Transport>(std::move(t));
}

absl::StatusOr<std::unique_ptr<exec::PeerWriter>> CudaBackend::NewPeerWriter(exec::DataOps& ops) {
  auto* cuda_ops = dynamic_cast<CudaDataOps*>(&ops);
  if (cuda_ops == nullptr || cuda_ops->device() != device()) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA peer writer of device ", device(),
                                                   " needs that device's CudaDataOps, not ",
                                                   ops.Name()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaPeerWriter> writer, CudaPeerWriter::Create(cuda_ops));
  return std::unique_ptr<exec::PeerWriter>(std::move(writer));
}

std::string CudaBackend::MemoryDomain() const { return plane::GpuMemoryDomain(); }

absl::StatusOr<std::unique_ptr<plane::Backend>> CreateCudaBackend(
    const plane::BackendConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(config.device));
  return std::unique_ptr<plane::Backend>(std::move(b));
}

absl::StatusOr<std::unique_ptr<plane::SwapArena>> CudaBackend::NewSwapArena(
    int64_t bytes, const std::string& name) {
  return NewCudaSwapArena(device(), bytes, name);
}

}  // namespace wsync::cuda
