// A worker's data-plane backend: the memory its tensors live in and what
// moves them. It opens the buffers owner processes register (and, for direct
// writes, the buffers of peer workers), and makes, per transfer channel, the
// data ops (compute), the transport (collective transfers) and the peer
// writer (direct writes). The composition root (worker/node/data_plane.h)
// builds a worker from one Backend; backends register by name in
// worker/node/backend_registry.cc, one line each.
#ifndef WSYNC_WORKER_PLANE_BACKEND_H_
#define WSYNC_WORKER_PLANE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/plane/data_ops.h"
#include "worker/plane/fd_batch.h"
#include "worker/plane/kv_store.h"
#include "worker/plane/peer_writer.h"
#include "worker/plane/swap_arena.h"
#include "worker/plane/transport.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::plane {

using transport::MemorySpace;

// The transport a backend connects: the proto's enum (TransportSetup.kind,
// RegisterWorkerRequest.transports).
using TransportKind = v1::TransportKind;
// "gloo", "nccl" (for messages).
std::string TransportKindName(TransportKind kind);

// Where a registered buffer lives: one of the three is set (the owner's
// registration or a peer's BufferInfo; cuda_vmm only from the owner, with the
// descriptor batch its token names in `fds`).
struct BufferLocation {
  const v1::HostShm* shm = nullptr;
  const v1::CudaIpc* cuda_ipc = nullptr;
  const v1::CudaVmm* cuda_vmm = nullptr;
  const FdBatch* fds = nullptr;
};

// A buffer opened in this process.
struct OpenedBuffer {
  void* data = nullptr;        // its first byte
  std::shared_ptr<void> hold;  // keeps the mapping open
  std::string identity;        // of the object mapped (shm: "<dev>:<ino>"); "" for device memory
};

// Mappings the buffers of one registry share (each object is mapped once
// while any buffer holds it); the keys are the backend's.
using MappingCache = std::map<std::string, std::weak_ptr<void>>;

// What a backend is created from (wsync-worker's flags).
struct BackendConfig {
  int device = -1;                         // GPU index (device backends)
  std::string data_address = "127.0.0.1";  // where a TCP transport listens and advertises
};

struct ConnectOptions {
  transport::KvStore* store = nullptr;  // rendezvous; not owned
  std::string prefix;                   // of the rendezvous keys
  int32_t rank = 0;
  int32_t size = 0;
  absl::Time deadline = absl::InfiniteFuture();  // every rank joined by then
  // Not owned, may be null: once true, the setup and later rounds end with
  // CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "host", "cuda:0".
  virtual std::string Name() const = 0;
  virtual TransportKind transport_kind() const = 0;
  virtual MemorySpace memory_space() const = 0;
  // Features the worker advertises beyond its transport (e.g. "cuda_ipc").
  virtual std::vector<std::string> capabilities() const = 0;
  // The device this backend moves ("GPU-..."), or "" for host memory.
  virtual std::string device_uuid() const { return ""; }

  // Opens `where` for a buffer of at least `bytes` bytes: one an owner
  // registered with this worker (peer = false), or a peer worker's buffer
  // this worker writes directly (peer = true). A location of the other
  // memory space is FAILED_PRECONDITION, a range that cannot hold `bytes`
  // INVALID_ARGUMENT; errors start with `what`. `cache` (may be null) shares
  // mappings between the buffers of one registry.
  virtual absl::StatusOr<OpenedBuffer> OpenBuffer(const BufferLocation& where, int64_t bytes,
                                                  bool peer, const std::string& what,
                                                  MappingCache* cache) = 0;

  // Per transfer channel: the compute, the collective transport and the
  // direct writer. The writer puts beside `ops` (they share a device); `ops`
  // outlives it.
  virtual absl::StatusOr<std::unique_ptr<exec::DataOps>> NewDataOps() = 0;
  virtual absl::StatusOr<std::unique_ptr<transport::Transport>> Connect(
      const ConnectOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<exec::PeerWriter>> NewPeerWriter(exec::DataOps& ops) = 0;

  // Direct writes: the memory domain this worker advertises (workers of one
  // domain can map each other's buffers; "" takes no part), and the devices
  // it can write (itself included; empty on the host).
  virtual std::string MemoryDomain() const = 0;
  virtual std::vector<std::string> WritableDevices() const { return {}; }
  // Whether a peer advertising `domain` and `device_uuid` can be written.
  bool CanWrite(const std::string& domain, const std::string& device_uuid) const;
  // Peer mappings the writer reaches more slowly than it could (metrics).
  virtual int64_t slow_peer_mappings() const { return 0; }

  // A remappable arena of at least `bytes` bytes in this backend's memory
  // (docs/commit-swap.md), named `name` in messages. UNIMPLEMENTED where the
  // backend has none; RESOURCE_EXHAUSTED when the memory is not there.
  virtual absl::StatusOr<std::unique_ptr<SwapArena>> NewSwapArena(int64_t bytes,
                                                                  const std::string& name);
};

}  // namespace wsync::plane

#endif  // WSYNC_WORKER_PLANE_BACKEND_H_
