// The full mesh of Gloo TCP pairs behind GlooTransport, connected under one
// deadline. Gloo's own connectFullMesh waits up to 5x the context timeout for
// *each* pair in turn, so a peer killed after it published its address held
// a rank for several times the sync's deadline (chaos run of issue 18: 20 s
// on a 4 s deadline) and failed the syncs after it. Here every pair is
// created with a fifth of the time left (so one pair's wait ends by the
// deadline) and the pairs connect on a thread of their own: ConnectMesh
// returns at the deadline or once `cancel` is set (within a 20 ms poll),
// naming the peer, while that thread finishes within its pairs' timeouts
// (see gloo_mesh.cc for why the pairs are not closed under it).
#ifndef WSYNC_WORKER_BACKENDS_HOST_GLOO_MESH_H_
#define WSYNC_WORKER_BACKENDS_HOST_GLOO_MESH_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"
#include "worker/plane/kv_store.h"

namespace wsync::transport {

struct MeshConnectOptions {
  KvStore* store = nullptr;  // rendezvous; not owned
  std::string prefix;        // of this generation's keys: <prefix>/addr/<from>/<to>
  absl::Time deadline;       // every pair connected by then
  // Not owned, may be null: once true, connecting ends with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

// A gloo::Context (rank, size) whose pairs ConnectMesh sets up; usable for
// unbound buffers once ConnectMesh returned OK.
class MeshContext : public gloo::Context {
 public:
  MeshContext(int rank, int size) : gloo::Context(rank, size) {}

  // Publishes this rank's pair addresses, then connects to every peer in
  // rank order. Errors name the peer rank and what it failed at: not
  // publishing its address in time (DEADLINE_EXCEEDED), the deadline passing
  // while its pair connected (DEADLINE_EXCEEDED), `cancel` (CANCELLED), or a
  // refused / lost connection (UNAVAILABLE). Call once.
  absl::Status ConnectMesh(std::shared_ptr<gloo::transport::Device> device,
                           const MeshConnectOptions& options);
};

}  // namespace wsync::transport

#endif  // WSYNC_WORKER_BACKENDS_HOST_GLOO_MESH_H_
