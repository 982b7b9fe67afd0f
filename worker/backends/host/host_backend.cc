#include "worker/backends/host/host_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checked_math.h"
#include "worker/backends/host/gloo_transport.h"
#include "worker/backends/host/host_data_ops.h"
#include "worker/backends/host/host_peer_writer.h"
#include "worker/backends/host/host_swap_arena.h"
#include "worker/backends/host/shm_mapping.h"
#include "worker/plane/memory_domain.h"

namespace wsync::host {

absl::StatusOr<plane::OpenedBuffer> HostBackend::OpenBuffer(const plane::BufferLocation& where,
                                                            int64_t bytes, bool peer,
                                                            const std::string& what,
                                                            plane::MappingCache* cache) {
  if (where.cuda_ipc != nullptr || where.cuda_vmm != nullptr) {
    return absl::FailedPreconditionError(
        peer ? absl::StrCat(what, ": device memory, but this worker moves host memory")
             : absl::StrCat(what,
                            ": CUDA device buffers need a worker with the GPU data plane "
                            "(wsync-worker --device N, built with WSYNC_WITH_CUDA); this one "
                            "moves host memory"));
  }
  if (where.shm == nullptr) {
    return absl::InvalidArgumentError(
        peer ? absl::StrCat(what,
                            ": no location (the peer's worker predates direct writes or did not "
                            "report it)")
             : absl::StrCat(what, ": no location (shm) given"));
  }
  const v1::HostShm& shm = *where.shm;
  if (shm.offset() < 0 || shm.size() < 0 || bytes < 0 || bytes > shm.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shm range [", shm.offset(), ", +",
                                                   shm.size(), ") cannot hold ", bytes, " bytes"));
  }
  const std::string key = absl::StrCat("shm:", shm.name());
  std::shared_ptr<ShmMapping> mapping;
  if (cache != nullptr) {
    if (auto it = cache->find(key); it != cache->end()) {
      mapping = std::static_pointer_cast<ShmMapping>(it->second.lock());
    }
  }
  if (mapping == nullptr) {
    auto m = ShmMapping::Open(shm.name());
    if (!m.ok()) {
      return absl::Status(m.status().code(), absl::StrCat(what, ": ", m.status().message()));
    }
    mapping = *std::move(m);
    if (cache != nullptr) (*cache)[key] = mapping;
  }
  if (!RangeWithin(shm.offset(), shm.size(), mapping->size(), what).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shm '", shm.name(), "' has ",
                                                   mapping->size(), " bytes, the buffer needs [",
                                                   shm.offset(), ", +", shm.size(), ")"));
  }
  plane::OpenedBuffer out;
  out.data = mapping->data() + shm.offset();
  out.identity = mapping->identity();
  out.hold = std::move(mapping);
  return out;
}

absl::StatusOr<std::unique_ptr<exec::DataOps>> HostBackend::NewDataOps() {
  return std::make_unique<exec::HostDataOps>();
}

absl::StatusOr<std::unique_ptr<transport::Transport>> HostBackend::Connect(
    const plane::ConnectOptions& options) {
  transport::GlooTransportOptions go;
  go.rank = options.rank;
  go.size = options.size;
  go.store = options.store;
  go.prefix = options.prefix;
  go.hostname = config_.data_address;
  go.deadline = options.deadline;
  go.cancel = options.cancel;
  auto t = transport::GlooTransport::Create(go);
  if (!t.ok()) return t.status();
  return std::unique_ptr<transport::Transport>(*std::move(t));
}

absl::StatusOr<std::unique_ptr<exec::PeerWriter>> HostBackend::NewPeerWriter(exec::DataOps& ops) {
  (void)ops;
  return std::make_unique<exec::HostPeerWriter>();
}

std::string HostBackend::MemoryDomain() const { return plane::HostMemoryDomain(); }

absl::StatusOr<std::unique_ptr<plane::Backend>> CreateHostBackend(
    const plane::BackendConfig& config) {
  return std::make_unique<HostBackend>(config);
}

absl::StatusOr<std::unique_ptr<plane::SwapArena>> HostBackend::NewSwapArena(
    int64_t bytes, const std::string& name) {
  return NewHostSwapArena(bytes, name);
}

}  // namespace wsync::host
