// The controller's state machine, free of gRPC: worker leases, assignment
// queues, the rendezvous key-value store, transfers and syncs. The gRPC
// services (worker_service.h, trainer_service.h) are thin adapters over it.
//
// One mutex guards everything; nothing slow (planning) runs under it. Every
// wait is bounded: streams poll with a timeout, KvGet and WaitSync take
// deadlines, and Tick() expires leases and sync deadlines.
#ifndef WSYNC_CONTROLLER_SERVER_STATE_H_
#define WSYNC_CONTROLLER_SERVER_STATE_H_

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/plan/direct_writes.h"
#include "controller/server/metrics.h"
#include "controller/server/plan_source.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

struct ControllerConfig {
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration sync_deadline = absl::Seconds(120);
  std::string instance;  // random per controller start
  // Let worker pairs of one memory domain write destinations directly
  // (SyncAssignment.direct_write_to); off: every bucket goes through the
  // transport.
  bool direct_writes = true;
};

class ControllerState {
 public:
  ControllerState(ControllerConfig config, ControllerMetrics* metrics, PlanSource* plans);
  ControllerState(const ControllerState&) = delete;
  ControllerState& operator=(const ControllerState&) = delete;

  // ----- Worker API.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& lease_id);
  absl::Status UpdateBuffers(const v1::UpdateBuffersRequest& req);
  // The lease's assignment stream: Open returns a token; a later Open (or the
  // lease's death) invalidates it. NextAssignment waits up to `wait`: OK and
  // nullopt means nothing yet; an error ends the stream.
  absl::StatusOr<uint64_t> OpenStream(const std::string& lease_id);
  absl::StatusOr<std::optional<v1::Assignment>> NextAssignment(const std::string& lease_id,
                                                               uint64_t token, absl::Duration wait);
  // A stream that ends kills its lease: a worker that lost its stream must
  // re-register (this is how a dead process is noticed in milliseconds).
  void CloseStream(const std::string& lease_id, uint64_t token, const std::string& why);
  absl::Status ReportProgress(const v1::ReportProgressRequest& req);
  absl::Status ReportResult(const v1::ReportResultRequest& req);
  absl::Status KvSet(const v1::KvSetRequest& req);
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& req);
  absl::StatusOr<v1::AwaitWritersResponse> AwaitWriters(const v1::AwaitWritersRequest& req);

  // ----- Trainer API.
  absl::StatusOr<v1::DefineTransferResponse> DefineTransfer(const v1::DefineTransferRequest& req);
  absl::StatusOr<v1::PlanResponse> PlanTransfer(const v1::PlanRequest& req);
  absl::StatusOr<v1::SyncResponse> StartSync(const v1::SyncRequest& req);
  // Returns once the sync ended or `timeout` passed (its current status).
  absl::StatusOr<v1::SyncStatus> WaitSync(const std::string& sync_id, absl::Duration timeout);
  // For WatchSync: returns once the sync changed after `*seen` (updated), it
  // ended, or `wait` passed.
  absl::StatusOr<v1::SyncStatus> NextSyncUpdate(const std::string& sync_id, int64_t* seen,
                                                absl::Duration wait);
  absl::StatusOr<v1::SyncStatus> Cancel(const std::string& sync_id, const std::string& reason);
  v1::GetStatusResponse GetStatus();
  v1::ListWorkersResponse ListWorkers(const std::string& group);

  // Expires leases and sync deadlines, refreshes gauges. Call periodically.
  void Tick();
  // Ends every stream and wait promptly (server shutdown).
  void Shutdown();

 private:
  struct Worker {
    std::string lease_id;
    v1::RegisterWorkerRequest info;
    absl::Time last_heartbeat;
    bool alive = true;
    absl::Time died_at;
    uint64_t stream_token = 0;  // 0: no stream open
    std::deque<v1::Assignment> outbox;
    // Its stream handler waits here (not on cv_): a report from one worker
    // must not wake every other worker's stream thread.
    absl::CondVar cv;
    int waiters = 0;
    absl::flat_hash_set<std::string> plans_sent;  // "<plan key>/<worker id>"
    // It reported that it cannot map its direct-write peers: it writes none.
    bool direct_writes_unavailable = false;
    // Identifies its current buffer registration (RegisterWorker, then each
    // UpdateBuffers), unique in this controller: peers that mapped an older
    // list get the new one.
    int64_t registration = 0;
    // The peer lists last sent to it, by transfer, then by the peer's worker
    // id in that assignment: (peer lease, its registration). Mirrors the
    // mappings the worker keeps: per transfer, the peers of its latest
    // assignment, for the kPeerListTransfers most recent transfers that
    // listed peers (`peer_list_order`, most recent first).
    std::map<std::string, std::map<int32_t, std::pair<std::string, int64_t>>> peer_lists_sent;
    std::list<std::string> peer_list_order;
    // After a failure: every list goes again.
    void ForgetPeerLists() {
      peer_lists_sent.clear();
      peer_list_order.clear();
    }
  };
  struct Participant {
    int32_t worker = 0;
    std::string lease_id;
    std::vector<v1::Membership> roles;
    bool done = false;
    int64_t bytes_done = 0;
  };
  struct SyncRecord {
    v1::SyncStatus status;
    absl::Time start;
    absl::Time deadline;
    std::vector<Participant> parts;
    int64_t changes = 0;
    bool finished() const { return status.phase() != v1::SYNC_RUNNING; }
  };
  struct Transfer {
    std::string name;
    std::string source_group;
    std::string destination_group;
    v1::TransferSpec spec;  // as defined by the trainer
    int64_t last_success_version = 0;
    int64_t generation = 0;
    std::vector<std::string> generation_leases;  // worker id -> lease
    bool generation_broken = false;
    std::string in_flight;  // sync id
    std::string last_sync;
    std::string plan_key;
  };
  // The transfer bound to the workers registered now.
  struct Resolved {
    v1::TransferSpec spec;                           // ranks and buffer names filled in
    std::vector<std::string> leases;                 // worker id -> lease
    std::vector<std::vector<v1::Membership>> roles;  // worker id -> roles
  };
  struct PlanForSync {
    std::shared_ptr<const v1::Plan> plan;
    bool cache_hit = false;
    double seconds = 0;
  };

  absl::StatusOr<Resolved> ResolveLocked(const std::string& name, const std::string& source_group,
                                         const std::string& destination_group,
                                         const v1::TransferSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<PlanForSync> GetPlan(const v1::TransferSpec& spec);
  absl::StatusOr<std::shared_ptr<const v1::Plan>> WorkerPart(const v1::Plan& plan, int32_t worker);
  absl::Status CheckBuffersLocked(const v1::Plan& part, int32_t worker, const Worker& w,
                                  bool require_all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The data-plane transport every worker of a transfer offers: "nccl" when
  // all run the GPU plane, else "gloo" when all run on host memory.
  // FAILED_PRECONDITION naming a worker of each kind when they are mixed.
  absl::StatusOr<std::string> CommonTransportLocked(const std::string& transfer,
                                                    const std::vector<std::string>& leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pairs of `eligible` (plan worker ids, sorted) whose workers can map
  // each other's memory now: the same non-empty direct_write_domain and, over
  // nccl, the receiver's GPU among the sender's peer_gpu_uuids.
  std::vector<plan::WorkerPair> DirectPairsLocked(const std::vector<plan::WorkerPair>& eligible,
                                                  const std::vector<std::string>& leases,
                                                  const std::string& transport_kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills direct_write_to, direct_written_by and peer_buffers of worker `w`'s
  // assignment from the sync's direct pairs.
  void FillDirectWritesLocked(const std::string& transfer,
                              const std::vector<plan::WorkerPair>& direct, int32_t w,
                              const std::vector<std::string>& leases, v1::SyncAssignment* sa)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDeadLocked(Worker& w, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a running sync; for failures `cause` names the worker (or -1).
  void FinishLocked(SyncRecord& sync, v1::SyncPhase phase, int32_t code, const std::string& error,
                    int32_t cause_worker, int32_t round, int32_t op, int32_t peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushLocked(Worker& w, v1::Assignment a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OpenScopeLocked(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Worker* FindAliveLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::SyncStatus SnapshotLocked(const SyncRecord& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ControllerConfig config_;
  ControllerMetrics* const metrics_;
  PlanSource* const plans_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // kv and sync changes (streams wait on Worker::cv)
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  // "<group>/<rank>" -> lease of the alive holder.
  absl::flat_hash_map<std::string, std::string> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<SyncRecord>> syncs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> sync_order_ ABSL_GUARDED_BY(mu_);  // for pruning
  // Rendezvous scopes: prefix "<transfer>/<generation>/" -> key -> value.
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, std::string>> kv_
      ABSL_GUARDED_BY(mu_);
  // Worker parts of plans: "<plan key>/<worker>" (built outside mu_).
  absl::Mutex parts_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Plan>> parts_
      ABSL_GUARDED_BY(parts_mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_STATE_H_
