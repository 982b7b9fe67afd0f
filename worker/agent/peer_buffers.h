// Direct writes (SyncAssignment.direct_*): the registered destination
// buffers of the peer workers this worker writes, mapped into this process
// by the worker's backend (plane::Backend::OpenBuffer with peer = true:
// POSIX shm for host workers, CUDA IPC with peer access for GPU workers).
#ifndef WSYNC_WORKER_AGENT_PEER_BUFFERS_H_
#define WSYNC_WORKER_AGENT_PEER_BUFFERS_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "worker/exec/buffer_registry.h"
#include "worker/plane/backend.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::agent {

// A fingerprint of a worker's registered buffers (names, dtypes, sizes,
// locations and, for shm, the identity of the object mapped: objects[i] for
// buffers[i], empty for device memory; order-independent, stable across
// processes and builds): a receiver sends its own in its ready tokens, and a
// writer compares it with that of what it mapped.
uint64_t BufferListFingerprint(const std::vector<const v1::BufferInfo*>& buffers,
                               const std::vector<std::string>& objects);

class PeerBufferMaps {
 public:
  // `backend` (not owned) maps the buffers; those of another memory space
  // are refused.
  explicit PeerBufferMaps(plane::Backend* backend) : backend_(backend) {}

  // Maps exactly the buffers of `peers` (each peer's list as the controller
  // relayed it), keeping the mappings of peers whose lists did not change
  // (or that the controller marks `unchanged`: see Holds) and dropping every
  // other. On error nothing of the failing peer is kept. Errors name the peer
  // worker and the buffer.
  absl::Status Update(const google::protobuf::RepeatedPtrField<v1::PeerBuffers>& peers);
  // Whether worker `worker`'s buffers are mapped from a list of the peer's
  // registration `registration`: what an `unchanged` entry needs.
  bool Holds(int32_t worker, int64_t registration) const;

  // Worker `worker`'s destination buffers ("<group>/<name>"), or null.
  const exec::BufferRegistry* Find(int32_t worker) const;
  // BufferListFingerprint of the list worker `worker`'s buffers were mapped
  // from (0 if none).
  uint64_t Fingerprint(int32_t worker) const;
  // Changes whenever any mapping changes: plans bound against the old ones
  // must be rebound.
  std::string Signature() const;
  // Unmaps everything (e.g. after a failed sync: a receiver whose owner
  // created its objects again under the same names is mapped afresh).
  void Clear() { peers_.clear(); }

 private:
  struct Peer {
    std::string serialized;    // the buffer list it was mapped from
    int64_t registration = 0;  // the controller's count for that list
    uint64_t fingerprint = 0;
    exec::BufferRegistry registry;
    std::vector<std::shared_ptr<void>> holds;  // keep the mappings open
  };
  absl::Status Map(const v1::PeerBuffers& list, Peer& peer);

  plane::Backend* const backend_;
  std::map<int32_t, std::shared_ptr<Peer>> peers_;
};

// A worker's PeerBufferMaps, one per transfer. A transfer keeps the mappings
// of the peers its latest assignment listed, so transfers that share the
// worker do not unmap each other's peers; only the kPeerListTransfers most
// recent transfers that listed peers keep theirs, so a transfer never synced
// again does not hold its peers' memory. The controller's record of the
// lists it sent follows the same rules (WorkerRegistry::FillPeerBuffers).
class PeerMapsByTransfer {
 public:
  explicit PeerMapsByTransfer(plane::Backend* backend) : backend_(backend) {}

  // Maps exactly `peers` for `transfer` (none: its mappings are released)
  // and makes it the most recent; the oldest beyond kPeerListTransfers is
  // unmapped.
  absl::Status Update(const std::string& transfer,
                      const google::protobuf::RepeatedPtrField<v1::PeerBuffers>& peers);
  // The transfer's maps, or null.
  const PeerBufferMaps* Find(const std::string& transfer) const;
  void Clear(const std::string& transfer);
  void ClearAll();

 private:
  plane::Backend* const backend_;
  std::map<std::string, std::unique_ptr<PeerBufferMaps>> maps_;
  std::list<std::string> order_;  // most recent first
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_PEER_BUFFERS_H_
