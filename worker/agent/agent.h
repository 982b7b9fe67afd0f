// The worker agent: holds a controller lease (register, heartbeat, re-register
// after a controller restart or a lost stream), receives assignments on the
// Assignments stream, runs syncs one at a time on its own thread with the
// SyncRunner, reports progress and results, and tells local subscribers (the
// owner process) when a sync starts and finishes.
#ifndef WSYNC_WORKER_AGENT_AGENT_H_
#define WSYNC_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/busy_poll.h"
#include "common/tls_file_stage.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent/commit_latch.h"
#include "worker/agent/event_queue.h"
#include "worker/agent/fd_inbox.h"
#include "worker/agent/lane_reporter.h"
#include "worker/agent/progress_reporter.h"
#include "worker/agent/serving.h"
#include "worker/agent/staged_gate.h"
#include "worker/agent/stream_cancel.h"
#include "worker/agent/sync_runner.h"
#include "worker/agent/tensor_table.h"
#include "worker/agent/worker_metrics.h"
#include "worker/plane/backend.h"
#include "wsync/v1/controller.grpc.pb.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

struct AgentOptions {
  std::string controller;  // host:port
  // How to reach it (controller_channel.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> controller_credentials;
  // The TLS files those credentials read (ControllerCredentialSet::files),
  // kept as long as the agent's channel.
  std::shared_ptr<TlsFileStage> controller_tls_files;
  std::vector<v1::Membership> memberships;
  std::string node;
  std::string device_uuid;
  std::string data_address = "127.0.0.1";
  // Features beyond the transport (which follows `gpu`), e.g. "cuda_ipc".
  std::vector<std::string> capabilities;
  std::string instance_id;
  absl::Duration round_timeout = absl::Seconds(60);
  // Phase gates between direct-write put phases (--put_gate_timeout; 0: off).
  absl::Duration put_gate_timeout = absl::Milliseconds(100);
  // 0: up to two plan rounds' staging. Sent at registration: the controller
  // plans within it.
  int64_t staging_limit_bytes = 0;
  // Staged syncs: the most shadow memory (--staging_budget_bytes; 0: no
  // limit). Sent at registration: the controller refuses plans over it.
  int64_t staging_budget_bytes = 0;
  // Staged syncs: how long past a sync's deadline a receiver that staged
  // waits for the pool's decision before it rolls back (--decision_slack).
  // Sent at registration: the controller offers a decided commit that long.
  absl::Duration decision_slack = absl::Seconds(5);
  // Staged syncs: how long HoldSyncs waits for a commit that began before
  // the hold to end (--hold_commit_wait; the hold stands either way).
  absl::Duration hold_commit_wait = absl::Seconds(10);
  // Staged syncs: how long a receiver that staged waits for each of its
  // owners (local subscribers) to read STAGED before it reports `staged`
  // (--staged_flush_timeout). An owner that does not read it in time fails
  // the sync here: the receiver rolls back and reports the failure, so the
  // pool never commits while an owner did not hear STAGED.
  absl::Duration staged_flush_timeout = absl::Seconds(5);
  // Test only (--test_corrupt_after_sync, refused unless
  // WSYNC_TEST_FAILPOINTS=1): "<group>/<tensor>" whose first byte this
  // worker flips in its live memory after each sync it receives (after the
  // commit of a staged one), before the verify pass. Host memory only.
  std::string test_corrupt_after_sync;
  // Test only (--test_commit_delay, refused unless WSYNC_TEST_FAILPOINTS=1):
  // each staged commit on this worker sleeps this long after COMMIT, before
  // it copies (a slow commit: later waves wait for it). 0: off.
  absl::Duration test_commit_delay = absl::ZeroDuration();
  // Test only (--test_drop_held_reports, refused unless
  // WSYNC_TEST_FAILPOINTS=1): the first N commit_held reports of this worker
  // are dropped before they are sent (a report lost on its way). 0: off.
  int32_t test_drop_held_reports = 0;
  // The cached parts' budget in bytes (part_cache.h; --parts_cache_bytes).
  int64_t parts_cache_bytes = int64_t{256} << 20;
  // Not owned (outlives the agent), never null: the worker's data-plane
  // backend (capabilities should be its capabilities()).
  plane::Backend* backend = nullptr;
  // Not owned (outlives the agent), may be null: the owner's weight arenas
  // (an embedded worker's); staged syncs into one commit by swapping
  // (docs/commit-swap.md).
  WeightArenas* arenas = nullptr;
  // Direct writes (see peer_buffers.h): the memory domain this worker
  // advertises (empty: it takes no part) and, on a GPU, the GPUs it can write.
  std::string direct_write_domain;
  std::vector<std::string> peer_gpu_uuids;
  // Not owned, may be null: the descriptor socket whose batches CudaVmm
  // registrations claim.
  FdInbox* fd_inbox = nullptr;
  // The low-latency mode (busy_poll.h, --busy_poll_ms): how long the
  // assignment reader and the exec thread spin after the last activity
  // before they sleep. Zero: off (they sleep); InfiniteDuration: always spin.
  absl::Duration busy_poll = absl::ZeroDuration();
  // The controller's control fast lane (--controller_lane, lane_reporter.h):
  // results are reported on this Unix socket, over gRPC when it is absent
  // or refuses. Empty: gRPC only.
  std::string controller_lane;
};

class WorkerAgent {
 public:
  WorkerAgent(AgentOptions options, WorkerMetrics* metrics);
  ~WorkerAgent();

  void Start();
  void Stop();  // aborts a running sync, ends threads (bounded)

  // Local API.
  // `who`: the owner process asking (TensorTable::Register's replace rule).
  absl::StatusOr<v1::RegisterTensorsResponse> RegisterTensors(const v1::RegisterTensorsRequest& req,
                                                              const Registrant& who = Registrant());
  // Memory of this process, by pointer (an embedded worker's owner): see
  // TensorTable::RegisterLocal.
  absl::StatusOr<v1::RegisterTensorsResponse> RegisterLocal(const std::string& group,
                                                            std::vector<LocalTensor> tensors,
                                                            bool replace);
  // `who` describes the subscriber (the stream's peer, "embedded owner"):
  // a staged sync that an owner did not read STAGED of names it.
  std::shared_ptr<EventQueue> Subscribe(const std::string& who = "a local subscriber");
  void Unsubscribe(const std::shared_ptr<EventQueue>& q);
  v1::LocalStatusResponse Status();
  // The version the owner serves for a group (serving.h): exported as a
  // metric and sent to the controller with the next heartbeat, at once.
  absl::Status SetServing(const v1::SetServingRequest& req);
  // Holds syncs off (non-empty `reason`) or admits them again (""). A held
  // worker fails each in-place sync it is assigned at once, before touching
  // any buffer, with FAILED_PRECONDITION naming `reason`, and tells its
  // subscribers (FINISHED, untouched); a sync already running in place is
  // not affected. A staged sync (docs/staging.md) writes only its shadows
  // while held; its commit, which writes the live tensors, waits until the
  // owner admits syncs, and is not made (the live tensors stay untouched,
  // ROLLED_BACK, listed uncommitted) if still held at the sync's deadline.
  // For owners whose memory must not be written at some times (an inference
  // engine generating, or with its weights asleep). A hold set while a staged
  // commit writes the live tensors (it began before the hold) waits for it
  // up to --hold_commit_wait (CommitLatch::Hold): returns the sync id of the
  // last commit that began since syncs were admitted ("" if none: nothing
  // was written), or DEADLINE_EXCEEDED while it still writes; the hold
  // stands either way.
  absl::StatusOr<std::string> HoldSyncs(std::string reason);

 private:
  struct Queued {
    v1::SyncAssignment assignment;
    std::string lease_id;
    uint64_t lease_epoch = 0;
    absl::Time received;  // read off the assignment stream
  };

  void SessionLoop();
  // Reads lease `lease_id`'s assignment stream (opened on `ctx`) until it
  // ends; returns how it ended. With busy polling on (agent_poll.cc), on a
  // completion queue this thread polls without sleeping while busy_ spins.
  grpc::Status ReadAssignments(grpc::ClientContext* ctx, const std::string& lease_id,
                               uint64_t epoch);
  // The stream over the control lane (agent_lane.cc), when --controller_lane
  // is set: its end, or nullopt when the lane cannot carry it (absent,
  // refused: a warning; then gRPC's stream is read).
  std::optional<grpc::Status> ReadAssignmentsLane(const std::string& lease_id, uint64_t epoch);
  grpc::Status ReadAssignmentsPolled(grpc::ClientContext* ctx, const v1::AssignmentsRequest& req,
                                     uint64_t epoch);
  // The exec thread, busy polling: spins (releasing mu_ between looks)
  // until `ready` holds, `until`, stop, or the spin window ended.
  template <typename Ready>
  void SpinFor(const Ready& ready, absl::Time until) ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop();
  void ExecLoop();
  void Publish(const v1::SyncEvent& e);
  // Publishes `e` and waits until every current subscriber read it, at
  // most --staged_flush_timeout: an error naming the subscribers that did
  // not.
  absl::Status PublishRead(const v1::SyncEvent& e);
  static v1::SyncEvent EventOf(const v1::SyncAssignment& a, v1::SyncEvent::Kind kind);
  // Counts sync `a`'s outcome and tells the subscribers (FINISHED).
  void PublishEnd(const v1::SyncAssignment& a, bool ok, const std::string& error, bool untouched);
  // Fails assignment `a` without running it when syncs are held, or when it
  // carries a version of its transfer older than the one this worker last
  // applied (a controller that lost its state must not roll the weights
  // back); true if so.
  bool RefuseIfHeldOrOlder(const v1::SyncAssignment& a, const std::string& lease_id);
  // Reports `a` failed with FAILED_PRECONDITION `error`, nothing written.
  void Refuse(const v1::SyncAssignment& a, const std::string& lease_id, const std::string& error);
  void OnAssignment(const v1::Assignment& a, const std::string& lease_id, uint64_t epoch);
  // Warm-up assignment `q` (agent_warm_up.cc, docs/warm-up.md): runs it
  // (SyncRunner::WarmUp) unless syncs are held, and reports it; applies no
  // version and tells the subscribers nothing.
  void RunWarmUp(const Queued& q);
  // Reports `r` for lease `lease_id` (agent_report.cc): over the control lane
  // when one is up, else gRPC, tried again while the channel is down or the
  // answer is lost (UNAVAILABLE, DEADLINE_EXCEEDED) for up to kReportPatience;
  // the controller takes a report it already has as delivered.
  // `patience` 0: one attempt (callers on the assignment stream's or the
  // registration's thread, which a retry would hold up).
  void Report(v1::ReportResultRequest r, const std::string& lease_id,
              absl::Duration patience = kReportPatience);
  static constexpr absl::Duration kReportPatience = absl::Seconds(15);
  // This worker's groups and ranks, for log lines ("trainer/0").
  std::string Who() const;
  // Staged syncs (agent_staged.cc). A receiver that staged sync `q` (its
  // report `r`) tells its owner STAGED, reports it and leaves the commit
  // pending (pending_): the exec thread steps it (StepStaged) until the
  // pool's decision (the gate) or the deadline plus --decision_slack, then
  // commits (COMMIT, COMMITTED) or rolls back (ROLLED_BACK), telling the
  // owner and the controller. A commit decided while the owner holds syncs
  // off is reported `commit_held` at once and waits for the owner until the
  // sync's deadline; admitted, it reports `commit_admitted` and awaits a new
  // CommitSync (the controller's next wave with room); still held at the
  // deadline, it rolls back, its live tensors untouched.
  struct PendingCommit {
    enum Phase { kDecision, kAdmission };
    Queued q;
    int64_t before = 0;  // the version its live tensors held
    Phase phase = kDecision;
    std::string held;                                 // the owner's reason (kAdmission)
    absl::Time held_reported = absl::InfinitePast();  // its last commit_held report
  };
  // Reports `p` commit_held (kAdmission), unless the test failpoint drops it.
  void ReportHeld(PendingCommit& p);
  void BeginStaged(const Queued& q, v1::ReportResultRequest r);
  // Acts on the pending commit if due; never blocks.
  void StepStaged();
  void CommitPending();
  // Drops the shadow, tells the owner ROLLED_BACK and, with `report`, the
  // controller.
  void RollBackPending(const std::string& reason, bool report = true);
  // When the pending commit stops waiting: the decision by the deadline plus
  // --decision_slack, the owner's admission by the deadline.
  absl::Time PendingDeadline(const PendingCommit& p) const;
  // Reports on the current lease (a new one after a restart), else `lease_id`.
  void ReportOnLease(v1::ReportResultRequest r, const std::string& lease_id);
  // Runs sync `q` (agent_exec.cc): reports it, or begins its commit.
  void RunSync(const Queued& q);
  // The queue index the exec thread runs next (-1: none): the front, or
  // beside a pending commit of `pending_transfer` the first warm-up of
  // another transfer.
  int NextRunnableLocked(const std::string& pending_transfer) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Registered (response `resp`): commits the awaited staged sync the
  // controller lists as decided, confirms again those already committed,
  // reports the listed ones it holds no shadow of, rolls back one not listed.
  void RejoinStaged(const v1::RegisterWorkerResponse& resp, uint64_t lease_epoch);
  // The report of staged sync `sync_id` after the decision (no lease set).
  static v1::ReportResultRequest DecidedReport(const std::string& sync_id);
  // The version the live tensors of `transfer` hold (0: none synced).
  int64_t Applied(const std::string& transfer);
  // After failed sync `a`: waits (past its deadline by at most a lease
  // period or two) until its direct writers into this worker reported or
  // were lost; returns those still pending ("" when none).
  std::string AwaitWriters(const v1::SyncAssignment& a, const std::string& lease_id);
  // Sends the newest buffer list to the controller unless `lease_id` already
  // has it. Serialized, so an older list never arrives last; a failed push
  // is retried by the heartbeat loop.
  void PushBuffers(const std::string& lease_id) ABSL_LOCKS_EXCLUDED(push_mu_);
  // PushBuffers unless a push is in flight (the heartbeat's retry).
  void RetryBuffersPush(const std::string& lease_id) ABSL_LOCKS_EXCLUDED(push_mu_);
  void PushBuffersLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  std::string lease() const;

  const AgentOptions options_;
  WorkerMetrics* const metrics_;
  TensorTable tensors_;
  ServingTable serving_;
  SyncRunner runner_;
  StagedGate gate_;    // staged syncs: the pool's decision
  CommitLatch latch_;  // the owner's hold and the commit writing its live tensors
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::WorkerService::Stub> stub_;
  LaneReporter lane_;  // options_.controller_lane
  // The lane's assignment stream of a lease epoch: asked to end (Stop, the
  // lease forgotten), never lost to a reader that starts late.
  StreamCancel lane_stream_cancel_;
  absl::Time lane_stream_retry_ = absl::InfinitePast();  // session thread only
  // Running syncs' progress, delivered off the exec thread (uses stub_).
  ProgressReporter progress_;

  std::atomic<bool> stop_{false};
  BusyPoll busy_;  // the low-latency mode's policy (options_.busy_poll)
  std::thread session_;
  std::thread heartbeat_;
  std::thread exec_;

  absl::Mutex push_mu_;
  // The lease that last got the buffer list and the TensorTable version sent.
  std::string pushed_lease_ ABSL_GUARDED_BY(push_mu_);
  uint64_t pushed_version_ ABSL_GUARDED_BY(push_mu_) = 0;

  mutable absl::Mutex mu_;
  std::string lease_id_ ABSL_GUARDED_BY(mu_);
  uint64_t lease_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  // Assignments aborted while queued: the exec thread caches their op lists
  // and reports them (ABORTED, nothing written), so that the controller
  // knows they never write a peer (its AwaitWriters waited for them).
  std::vector<Queued> dropped_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<EventQueue>> subscribers_ ABSL_GUARDED_BY(mu_);
  int64_t subscriptions_ ABSL_GUARDED_BY(mu_) = 0;  // numbers the subscribers
  int64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Per transfer, the last version applied here (older ones are refused).
  std::map<std::string, int64_t> applied_ ABSL_GUARDED_BY(mu_);
  int32_t syncs_ok_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t syncs_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t gate_wakes_ ABSL_GUARDED_BY(mu_) = 0;  // decisions the gate announced
  // The sync whose decided commit awaits the owner's admission (kAdmission;
  // RejoinStaged repeats its commit_held on a new lease); "" if none.
  std::string held_sync_ ABSL_GUARDED_BY(mu_);
  bool held_report_due_ ABSL_GUARDED_BY(mu_) = false;  // a registration asks for it again
  std::optional<PendingCommit> pending_;               // the exec thread's only
  int32_t held_reports_dropped_ = 0;                   // the exec thread's only (test failpoint)
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_AGENT_H_
