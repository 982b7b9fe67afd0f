// WorkerRegistry: the controller's worker leases, their assignment streams
// (outboxes) and registered buffers, plus what each lease was already sent
// (plan parts, peer buffer lists).
//
// Locking: one mutex, held only inside a call; the registry never calls
// another owner while holding it. A lost lease (expired, stream closed,
// replaced) is reported to the loss listener after the lock is released, in
// the call that lost it. Other owners may call in while holding their own
// lock (see controller.h for the order).
#ifndef WSYNC_CONTROLLER_SERVER_WORKER_REGISTRY_H_
#define WSYNC_CONTROLLER_SERVER_WORKER_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/server/config.h"
#include "controller/server/metrics.h"
#include "controller/server/revocation.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// One alive worker as the other owners see it; later calls do not change it.
struct WorkerSnapshot {
  std::string lease_id;
  std::shared_ptr<const v1::RegisterWorkerRequest> info;  // never null
  // Its current buffer registration (see WorkerRegistry::Worker).
  int64_t registration = 0;
  // It reported that it cannot map its direct-write peers.
  bool direct_writes_unavailable = false;
  // Some of its buffers report no location a peer could map (CUDA virtual
  // memory from the owner's descriptors): it is never written directly.
  bool unmappable_buffers = false;
  std::string description;  // "worker src/0 (pid 12 on node-a)"
};

// A lease that ended, for the loss listener.
struct WorkerLoss {
  std::string lease_id;
  std::string description;
  std::string reason;
  // Its assignment stream's wake (OpenStream), called before the listener so
  // that the stream ends; empty when it had none.
  std::function<void()> wake_stream;
};

// The client certificate a lease registered with (PEM; both empty in
// plaintext or without one). A front end that admits a worker's calls by
// its lease alone, without a certificate per call (the control fast lane),
// checks this one against --tls_crl_file on each call, as gRPC checks the
// certificate each call presents (Authenticator::CheckRevokedCertificate):
// the registry keeps it parsed (IdentifyCertificate, once, at registration).
struct LeaseCertificate {
  std::string leaf_pem;
  std::string chain_pem;
};

class WorkerRegistry {
 public:
  // `metrics` may be null.
  WorkerRegistry(ControllerConfig config, ControllerMetrics* metrics);
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Called once per lost lease, without the registry's lock. Set before use.
  void SetLossListener(std::function<void(const WorkerLoss&)> listener);

  // ----- Worker API.
  // `identity`: the caller's authenticated identity ("" in plaintext), bound
  // to the new lease (see CheckCaller). The lease id is 128 random bits from
  // the OS CSPRNG. A live lease of the same instance_id is replaced only when
  // `previous_lease` is its id and `identity` its identity; otherwise
  // ALREADY_EXISTS (an instance id is listed: it is no credential).
  // `certificate`: the one the caller presented (kept with the lease).
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& req, const std::string& identity = "",
      const std::string& previous_lease = "", const LeaseCertificate& certificate = {});
  // Whether the caller of identity `identity` may act for `lease_id`: OK when
  // the lease is unknown or dead (the call then fails NOT_FOUND where it is
  // used) or is bound to `identity`; PERMISSION_DENIED naming both otherwise.
  absl::Status CheckCaller(const std::string& lease_id, const std::string& identity,
                           absl::string_view method);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& lease_id);
  absl::Status UpdateBuffers(const v1::UpdateBuffersRequest& req);
  // The lease's assignment stream: Open returns a token; a later Open (or the
  // lease's death) invalidates it. NextAssignment waits up to `wait` (zero:
  // not at all): OK and nullopt means nothing yet; an error ends the stream.
  // `wake`, if set, is called without the registry's lock whenever the
  // stream's NextAssignment may have something new to say: an assignment
  // pushed, the lease dead, the stream replaced, the controller shutting
  // down. It may run on any thread and after the stream ended.
  absl::StatusOr<uint64_t> OpenStream(const std::string& lease_id,
                                      std::function<void()> wake = nullptr);
  absl::StatusOr<std::optional<v1::Assignment>> NextAssignment(const std::string& lease_id,
                                                               uint64_t token, absl::Duration wait);
  // A stream that ends kills its lease: a worker that lost its stream must
  // re-register (this is how a dead process is noticed in milliseconds).
  void CloseStream(const std::string& lease_id, uint64_t token, const std::string& why);
  v1::ListWorkersResponse ListWorkers(const std::string& group);

  // ----- Queries (other owners).
  bool IsAlive(const std::string& lease_id);
  // The certificate a live lease registered with, parsed at registration
  // (null inside: it registered without one); nullopt when `lease_id` is not
  // a live lease.
  std::optional<std::shared_ptr<const CertificateIdentity>> LiveCertificate(
      const std::string& lease_id);
  // Changes whenever what a sync binds to may have changed: a registration,
  // a buffer update, a lease's death, a worker losing its direct writes.
  // Equal values mean every snapshot taken in between is still current.
  uint64_t epoch() const { return epoch_.load(); }
  std::optional<WorkerSnapshot> Find(const std::string& lease_id);  // alive only
  // "worker src/0+dst/1 (pid P on N)", or "lease L" once it is pruned.
  std::string Describe(const std::string& lease_id);
  // A group's live holders: size -1 when no live worker is in it, else one
  // entry per rank (nullopt: rank not held).
  struct Group {
    int32_t size = -1;
    std::vector<std::optional<WorkerSnapshot>> ranks;
  };
  Group FindGroup(const std::string& group);
  struct Counts {
    int registered = 0;
    int alive = 0;
  };
  Counts CountWorkers();

  // ----- Dispatch (the sync coordinator).
  // Queues an assignment on the lease's stream; false if it is not alive.
  bool Push(const std::string& lease_id, v1::Assignment a);
  // True the first time `part_key` is marked for this lease (send the part).
  bool MarkPartSent(const std::string& lease_id, const std::string& part_key);
  // The lease may not hold `part_key` (its assignment was dropped unrun):
  // the next MarkPartSent for it returns true again.
  void ForgetPartSent(const std::string& lease_id, const std::string& part_key);
  void MarkDirectWritesUnavailable(const std::string& lease_id);
  // After a failure: every peer list goes again to this lease.
  void ForgetPeerLists(const std::string& lease_id);
  // Fills sa->peer_buffers for the peers this lease writes (plan worker id,
  // peer lease; sorted by worker id) and records what was sent, mirroring
  // the mappings the worker keeps: per transfer, the peers of its latest
  // assignment, for the kPeerListTransfers most recent transfers that listed
  // peers. A list unchanged since it was last sent goes as `unchanged`.
  void FillPeerBuffers(const std::string& lease_id, const std::string& transfer,
                       const std::vector<std::pair<int32_t, std::string>>& write_to,
                       v1::SyncAssignment* sa);

  // Expires leases, prunes long-dead ones, refreshes the worker gauges.
  void Tick();
  // Ends every stream promptly.
  void Shutdown();

 private:
  struct Worker {
    std::string lease_id;
    std::string identity;  // authenticated at registration ("" in plaintext)
    // Presented at registration (null: none), parsed then.
    std::shared_ptr<const CertificateIdentity> certificate;
    std::shared_ptr<const v1::RegisterWorkerRequest> info;
    absl::Time last_heartbeat;
    bool alive = true;
    absl::Time died_at;
    uint64_t stream_token = 0;   // 0: no stream open
    std::function<void()> wake;  // the open stream's (OpenStream)
    std::deque<v1::Assignment> outbox;
    // Its stream handler waits here: a report from one worker must not wake
    // every other worker's stream thread.
    absl::CondVar cv;
    int waiters = 0;
    absl::flat_hash_set<std::string> parts_sent;  // SyncAssignment.part_key
    bool direct_writes_unavailable = false;
    bool unmappable_buffers = false;  // of info's buffers, set with them
    // Identifies its current buffer registration (RegisterWorker, then each
    // UpdateBuffers), unique in this controller: peers that mapped an older
    // list get the new one.
    int64_t registration = 0;
    // The peer lists last sent to it, by transfer, then by the peer's worker
    // id in that assignment: (peer lease, its registration), and the
    // transfers in most-recent-first order.
    std::map<std::string, std::map<int32_t, std::pair<std::string, int64_t>>> peer_lists_sent;
    std::list<std::string> peer_list_order;
  };

  Worker* FindAliveLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkerSnapshot SnapshotLocked(const Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckMembershipsLocked(const v1::RegisterWorkerRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckReplacementLocked(const v1::RegisterWorkerRequest& req,
                                      const std::string& identity,
                                      const std::string& previous_lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDeadLocked(Worker& w, const std::string& reason, std::vector<WorkerLoss>* lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(const std::vector<WorkerLoss>& lost) ABSL_LOCKS_EXCLUDED(mu_);

  const ControllerConfig config_;
  ControllerMetrics* const metrics_;
  std::function<void(const WorkerLoss&)> on_loss_;

  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<uint64_t> epoch_{1};
  absl::flat_hash_map<std::string, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  // "<group>/<rank>" -> lease of the alive holder.
  absl::flat_hash_map<std::string, std::string> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_WORKER_REGISTRY_H_
