// SyncCoordinator: transfers (definition, binding to the registered workers,
// plans and their per-worker parts, routes) and syncs (dispatch, reports,
// completion, aborts, deadlines).
//
// Locking: one mutex. While holding it the coordinator calls the
// WorkerRegistry (queries, pushes) and the Rendezvous (scopes); neither calls
// back while holding its own lock, so the order is always
// SyncCoordinator -> WorkerRegistry and SyncCoordinator -> Rendezvous.
// Planning and part extraction run unlocked (parts have their own cache lock,
// a leaf); routes are decided again under the lock only when a worker's
// direct-write state changed meanwhile. Every wait is bounded: WaitSync and NextSyncUpdate take
// deadlines, Tick() ends syncs past theirs.
//
// Durability (StateStore, optional): every definition and every finished
// sync is saved before anyone can see it (under the lock, before waiters
// wake); Restore takes a saved state over at startup. Versions never go
// backwards: a sync of a version older than the last delivered one is
// refused, the same one only with SyncRequest.resend.
//
// Blame: a failure a worker reports about its peers (UNAVAILABLE,
// DEADLINE_EXCEEDED, CANCELLED, ABORTED: a lost connection, a silent peer)
// does not end the sync at once. It settles when every other live worker
// reported, when a participant is lost (the lost one is the cause), or after
// ControllerConfig::failure_grace (the first reporter is the cause). A sync
// past its deadline settles once the live workers reported or the grace
// passed: the workers that did not report are the cause.
#ifndef WSYNC_CONTROLLER_SERVER_SYNC_COORDINATOR_H_
#define WSYNC_CONTROLLER_SERVER_SYNC_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/plan/routes.h"
#include "controller/server/config.h"
#include "controller/server/metrics.h"
#include "controller/server/part_cache.h"
#include "controller/server/plan_source.h"
#include "controller/server/rendezvous.h"
#include "controller/server/rollout.h"
#include "controller/server/state_store.h"
#include "controller/server/steps_fallback_log.h"
#include "controller/server/sync_records.h"
#include "controller/server/wait_hub.h"
#include "controller/server/warm_up.h"
#include "controller/server/worker_checks.h"
#include "controller/server/worker_registry.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

class SyncCoordinator {
 public:
  // `metrics` and `store` may be null (no state persists); the others must
  // outlive the coordinator.
  SyncCoordinator(ControllerConfig config, ControllerMetrics* metrics, PlanSource* plans,
                  WorkerRegistry* workers, Rendezvous* rendezvous, StateStore* store = nullptr);
  SyncCoordinator(const SyncCoordinator&) = delete;
  SyncCoordinator& operator=(const SyncCoordinator&) = delete;

  // Takes over a saved state before serving: its transfers (as defined),
  // their last delivered versions and the outcomes of the latest syncs.
  // Sync ids handed out before it answer NOT_FOUND "unknown after restart",
  // except staged syncs whose commit was decided (sync_decided.cc): those
  // resume their commit phase, running until their receivers confirm.
  void Restore(const v1::ControllerState& state);
  // A worker registered (lease `lease_id`, `req`): every running staged sync
  // whose commit is decided and that awaits a receiver of its group ranks
  // with no live lease (restored after a restart) binds that receiver to
  // `lease_id` and is listed in resp->decided_commits (docs/staging.md).
  void Rejoin(const std::string& lease_id, const v1::RegisterWorkerRequest& req,
              v1::RegisterWorkerResponse* resp);

  // ----- Trainer API. PERMISSION_DENIED naming the owner's identity and the
  // caller's when `caller` may not act on the transfer (see TrainerCaller).
  // A new transfer is owned by its caller; one without an owner (defined
  // anonymously, or restored from a state file saved before owners existed)
  // is claimed by the first non-admin identity that defines or syncs it.
  absl::StatusOr<v1::DefineTransferResponse> DefineTransfer(const v1::DefineTransferRequest& req,
                                                            const TrainerCaller& caller = {});
  absl::StatusOr<v1::PlanResponse> PlanTransfer(const v1::PlanRequest& req);
  absl::StatusOr<v1::SyncResponse> StartSync(const v1::SyncRequest& req,
                                             const TrainerCaller& caller = {});
  // Returns once the sync ended or `timeout` passed (its current status; its
  // final one also when the record was pruned meanwhile).
  absl::StatusOr<v1::SyncStatus> WaitSync(const std::string& sync_id, absl::Duration timeout);
  // For WaitSync / WatchSync: returns once the sync changed after `*seen`
  // (updated), it ended, or `wait` passed; UNAVAILABLE once shut down with
  // the sync still running (so that callers looping on it stop).
  absl::StatusOr<v1::SyncStatus> NextSyncUpdate(const std::string& sync_id, int64_t* seen,
                                                absl::Duration wait);
  // An admin cancels any sync; a trainer the syncs of the transfers it owns
  // (of an unowned transfer: the syncs it started).
  absl::StatusOr<v1::SyncStatus> Cancel(const std::string& sync_id, const std::string& reason,
                                        const TrainerCaller& caller = {});
  v1::GetStatusResponse GetStatus();

  // ----- Worker API.
  absl::Status ReportProgress(const v1::ReportProgressRequest& req);
  absl::Status ReportResult(const v1::ReportResultRequest& req);
  absl::StatusOr<v1::AwaitWritersResponse> AwaitWriters(const v1::AwaitWritersRequest& req);

  // A lease ended (the registry's loss listener): its running syncs fail,
  // naming it.
  void WorkerLost(const WorkerLoss& loss);
  // Ends syncs past their deadline and prunes old records. Call periodically.
  void Tick();
  // Warm-ups (sync_warm_up.cc, docs/warm-up.md): ends those past their
  // deadline (and syncs that waited for one past theirs), then starts one
  // for every transfer whose definition, workers or transport generation
  // changed since its last warm-up (planning unlocked, mostly a cache hit).
  // Call periodically, after Tick.
  void WarmUpTick();
  // Ends every wait promptly.
  void Shutdown();
  // Runs `listener` (under the coordinator's lock; it must not call back) on
  // every change a wait may be waiting for. Set before the coordinator is shared.
  void SetChangeListener(std::function<void()> listener) { cv_.SetListener(std::move(listener)); }
  // The replica label its owner reported for destination rank `rank` of
  // `group` held by lease `lease` ("" none); called under the coordinator's
  // lock (it must not call back). Set before the coordinator is shared;
  // unset: every rank unlabelled (docs/staging-rollout.md, "Rolling waves").
  using ReplicaLabeler =
      std::function<std::string(const std::string& group, int32_t rank, const std::string& lease)>;
  void SetReplicaLabeler(ReplicaLabeler labeler) { labeler_ = std::move(labeler); }
  // Fills RegisteredWorker.serving_versions of every worker of `resp`: per
  // destination rank it holds, per transfer, the version this worker
  // committed last (sync_rollout.cc).
  void AddServingVersions(v1::ListWorkersResponse* resp);
  // How many times put phases were planned (tests): once per plan and pair set.
  int64_t put_phase_plans() const { return parts_.put_phase_plans(); }

 private:
  // A transfer's and a sync's planning records (sync_records.h).
  using Transfer = sync_records::Transfer;
  using Resolved = sync_records::Resolved;
  using PlanForSync = sync_records::PlanForSync;
  using Dispatch = sync_records::Dispatch;
  using RoutedPartRef = sync_records::RoutedPartRef;
  using Prepared = sync_records::Prepared;

  struct Participant {
    int32_t worker = 0;
    std::string lease_id;
    std::vector<v1::Membership> roles;
    std::string part_key;  // SyncAssignment.part_key
    absl::Time pushed;     // its assignment was queued
    bool done = false;
    int64_t bytes_done = 0;
    // The most its reports may claim: the plan's bytes into it (received
    // plus local copies, RankSummary).
    int64_t bytes_planned = 0;
    // Its report (code 0 until a failure is reported).
    int32_t code = 0;
    std::string message;
    int32_t round = -1, op = -1, peer = -1;
    // Staged syncs: it writes a shadow (a receiver), it reported staged,
    // with these checksums (received and, relaying, sent).
    bool stages = false;
    bool staged = false;
    std::vector<v1::BucketChecksum> checksums;
    // Rolling waves (sync_rollout.cc): its replica (index in
    // SyncRecord::replicas), CommitSync sent to it, and it confirmed.
    int32_t replica = -1;
    bool commit_sent = false;
    bool committed = false;
    // Its owner held syncs off when its CommitSync came (commit_held): it
    // serves the old version and awaits its owner; its replica counts as
    // held (not committing) until it reports commit_admitted, then waits
    // for a wave again (commit_sent cleared).
    bool held = false;
    // A receiver whose lease ended after the decision (or restored without
    // one): it may register again (Rejoin) until the deadline plus its
    // worker's --decision_slack, which it waits for the decision itself.
    std::string lost;                              // why, "" while bound to a live lease
    absl::Time lost_since = absl::InfinitePast();  // when `lost` was set
    absl::Duration decision_slack = absl::Seconds(5);
    // Verify mode (sync_verify.cc): its verify pass, from its last report.
    bool verify_pass = false;
    std::vector<v1::BucketChecksum> verify_checksums;
    std::vector<v1::VerifyNote> verify_notes;
    int32_t verify_local_buckets = 0;
    int64_t verify_local_bytes = 0;
  };
  struct SyncRecord {
    v1::SyncStatus status;
    absl::Time start;
    absl::Time deadline;
    std::vector<Participant> parts;
    std::string started_by;  // the trainer's identity
    int64_t changes = 0;
    // A failure reported about peers waits here to be attributed (see the
    // top): settles by then at the latest.
    absl::Time settle_at = absl::InfiniteFuture();
    // Staged syncs: when the commit was decided (Cancel names it).
    absl::Time decided = absl::InfinitePast();
    int32_t first_failure = -1;  // worker id of the first failed report
    // It failed on a worker's report about its peers: a participant lost
    // shortly after takes the blame (BlameLostPeerLocked).
    bool blamed_reporter = false;
    // Staged syncs (docs/staging.md): the transfer's options, and the plan
    // (bucket checksums name their tensors).
    v1::StagingOptions staging;
    std::shared_ptr<const v1::Plan> plan;
    int32_t commits_confirmed = 0;  // receivers that confirmed the commit
    int32_t commits_pushed = 0;     // CommitSync messages queued
    // Rolling waves: the transfer's policy, the receivers' replicas (set at
    // the decision) and the number of the next wave.
    v1::RolloutPolicy rollout;
    std::vector<RolloutReplica> replicas;
    int32_t next_wave = 0;
    bool finished() const { return status.phase() != v1::SYNC_RUNNING; }
    // Set while it waits for its transfer's warm-up: its assignments go out
    // (DispatchLocked) once the warm-up ended.
    std::shared_ptr<const Prepared> held;
  };

  // ----- sync_transfers.cc
  absl::StatusOr<Resolved> Resolve(const std::string& name, const std::string& source_group,
                                   const std::string& destination_group,
                                   const v1::TransferSpec& spec);
  // The plan of `resolved` (staging limits checked) and, `with_parts`, each
  // worker's part.
  absl::StatusOr<PlanForSync> GetPlan(const Resolved& resolved, bool with_parts);
  // DefineTransfer's checks and record, under the lock (`plan` with parts).
  absl::StatusOr<v1::DefineTransferResponse> RecordDefinition(const v1::DefineTransferRequest& req,
                                                              const TrainerCaller& caller,
                                                              const Resolved& resolved,
                                                              const PlanForSync& plan)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ----- sync_dispatch.cc
  // A fresh Prepared for `t` (binding, planning, routing), run unlocked.
  absl::StatusOr<std::shared_ptr<Prepared>> Prepare(const Transfer& t, uint64_t registry_epoch);
  // The Prepared of the last sync of `name`, if still current.
  std::shared_ptr<const Prepared> ReusableLocked(const std::string& name, uint64_t definition,
                                                 uint64_t registry_epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckStartLocked(const Transfer& t, const v1::SyncRequest& req,
                                const TrainerCaller& caller) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every worker of `resolved` is alive and holds every buffer its part
  // uses; returns their leases (by worker id). A worker whose direct-write
  // state (domain, unavailable) changed since `resolved` was taken is
  // updated there and *reroute set: its routes must be decided again.
  absl::StatusOr<std::vector<std::string>> CheckWorkersLocked(Resolved& resolved,
                                                              const PlanForSync& plan,
                                                              bool* reroute)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new transport generation (and rendezvous scope) when the transfer has
  // none yet, its last one broke or its workers changed.
  void RenewGenerationLocked(Transfer& t, const std::vector<std::string>& leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transport and the peer-write pairs (the route stage, controller/plan/routes.h).
  Dispatch Decide(const std::string& transfer, const Resolved& resolved, const PlanForSync& plan);
  std::vector<RoutedPartRef> Route(const PlanForSync& plan, const Dispatch& dispatch);
  std::unique_ptr<SyncRecord> NewRecordLocked(const Transfer& t, const v1::SyncRequest& req,
                                              const PlanForSync& plan, absl::Time trigger,
                                              int32_t num_workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes every participant's assignment of `sync` (built from `prepared`).
  void DispatchLocked(const Transfer& t, SyncRecord& sync, const Prepared& prepared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::SyncAssignment AssignmentLocked(const Transfer& t, const SyncRecord& sync,
                                      const Resolved& resolved, const Dispatch& dispatch,
                                      const RoutedPartRef& part, int32_t worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_transfers.cc
  // OK when `caller` may `action` ("sync", "redefine", "cancel syncs of")
  // transfer `name` owned by `owner` ("": anyone); PERMISSION_DENIED, led by
  // `method` and naming both identities, otherwise.
  static absl::Status CheckOwner(absl::string_view method, const std::string& name,
                                 const std::string& owner, const TrainerCaller& caller,
                                 absl::string_view action);
  // Records `caller` as the owner of an unowned `t` (see DefineTransfer).
  static void ClaimOwner(Transfer& t, const TrainerCaller& caller);

  // ----- sync_warm_up.cc (docs/warm-up.md)
  // Starts transfer `name`'s warm-up if one is due (WarmUpDueLocked) and its
  // workers can be prepared (else records why: PENDING); returns its id, ""
  // when none started.
  std::string StartWarmUp(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // The id of the warm-up launched for transfer `name`'s current definition
  // by whichever caller launched it (DefineTransfer or the tick), "" if none
  // was.
  std::string WarmUpLaunchedFor(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  bool WarmUpDueLocked(const Transfer& t, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes the warm-up assignments of `prepared` (its checks done).
  std::string LaunchWarmUpLocked(Transfer& t, const Prepared& prepared, std::string signature)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `prepared` would prepare on its workers under t's generation.
  std::string WarmSignatureLocked(const Transfer& t, const Prepared& prepared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A report of the running warm-up (its id): handled, or an error; nullopt
  // when `req` is about a sync.
  std::optional<absl::Status> WarmUpReportLocked(const v1::ReportResultRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends t's running warm-up: WARM, or FAILED with `reason` (the generation
  // is then broken, the other workers get an abort); then releases the sync
  // that waited for it.
  void EndWarmUpLocked(Transfer& t, bool ok, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The id of a running warm-up (of any transfer) with a worker among
  // `leases`; "" when none.
  std::string WarmingUpLocked(const std::vector<std::string>& leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Dispatches t's in-flight sync if it waited for warm-ups and none of its
  // workers' is running any more.
  void ReleaseHeldLocked(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A lost lease fails every running warm-up it takes part in.
  void WarmUpLostLocked(const WorkerLoss& loss) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancel of a warm-up id: aborts it; nullopt when `id` names none.
  std::optional<absl::StatusOr<v1::SyncStatus>> CancelWarmUpLocked(const std::string& id,
                                                                   const std::string& reason,
                                                                   const TrainerCaller& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillWarmUpLocked(const Transfer& t, v1::WarmUpStatus* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SyncStatus.warm_up for a sync dispatched now.
  std::string WarmNoteLocked(const Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_durability.cc
  // Saves transfers, versions and the latest outcomes (no-op without a
  // store); a failed save is logged and counted, the sync's outcome stands.
  // Saves the state (when a --state_file is set); a failure is logged and
  // counted, and returned for the callers that must not go on without it.
  absl::Status PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NOT_FOUND for a sync id this controller does not know, telling whether
  // it ran under an earlier instance (before a restart).
  absl::Status UnknownSyncLocked(const std::string& sync_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_decided.cc
  // Adds every running staged sync past its commit decision to `state`.
  void SaveDecidedLocked(v1::ControllerState* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the decided syncs of a saved state over (after its transfers).
  void RestoreDecidedLocked(const v1::ControllerState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ControllerConfig::test_crash_after_commits: SIGKILLs this process once
  // `confirmed` receivers of decided sync `sync` confirmed (test only).
  void TestCrashPointLocked(const SyncRecord& sync, int32_t confirmed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_staged.cc (docs/staging.md)
  // Whether `req` repeats the staged report `p` gave (bytes and checksums).
  static bool SameStagedReport(const Participant& p, const v1::ReportResultRequest& req);
  // A report of staged sync `sync` that the two phases handle (a staged
  // report, a report after the commit decision, or a protocol error);
  // false: the ordinary path applies.
  bool StagedReportLocked(SyncRecord& sync, Participant& p, const v1::ReportResultRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every participant reported success or staged: compares the bucket
  // checksums and sends CommitSync to every receiver (or fails the sync).
  void MaybeCommitLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every network bucket of the plan has exactly one checksum from its
  // sender and one from its receiver, and they match: else DATA_LOSS (a
  // mismatch) or FAILED_PRECONDITION (one missing, doubled, from another
  // worker or of no network bucket), naming the bucket, its tensor and both
  // workers; *cause is the worker at fault (the receiver on a mismatch).
  absl::Status VerifyChecksumsLocked(SyncRecord& sync, int32_t* cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the decision: participant `p` will not confirm (`why`).
  void UncommittedLocked(SyncRecord& sync, Participant& p, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the decision: SUCCEEDED once every receiver confirmed or was
  // counted uncommitted (and, in verify mode, the verify passes compared).
  void MaybeFinishCommitLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the decision, past the deadline (sync_decided.cc): lists the
  // receivers that did not confirm uncommitted, except a lost one while it
  // may still register again (the deadline plus its --decision_slack); one
  // whose rolling wave never started is told to roll back.
  void SettleDecidedLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_verify.cc (docs/staging.md, "Verify")
  // Keeps participant `p`'s verify pass from report `req`.
  static void KeepVerifyPass(Participant& p, const v1::ReportResultRequest& req);
  // Verify mode, once every participant reported: compares each network
  // bucket's live destination with its source (the receiver's verify hash
  // with the sender's), counts the local copies the workers compared and the
  // buckets not verifiable into sync.status. A mismatch (or a hash missing
  // without a note saying why) is DATA_LOSS / FAILED_PRECONDITION naming the
  // bucket, its tensor, sender and receiver; *receiver: the worker whose
  // memory differs (-1: none).
  absl::Status CompareVerifyLocked(SyncRecord& sync, int32_t* receiver)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Verify mode at the end of a sync that would succeed: compares and, on a
  // mismatch, fails it (after a commit, listing the receiver uncommitted).
  // True when it finished the sync.
  bool FinishVerifyLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_rollout.cc (docs/staging-rollout.md, "Rolling waves")
  // At the decision: groups the receivers of `sync` into replicas.
  void GroupReplicasLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<ReplicaPhase> PhasesLocked(const SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A decided sync's receiver `p` reports its owner's hold (`req`
  // commit_held / commit_admitted, docs/staging.md "An owner holding syncs
  // off"): its replica is held, or waits for a wave again.
  void HeldReportLocked(SyncRecord& sync, Participant& p, const v1::ReportResultRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the next wave's receivers commit_sent (none while one commits);
  // returns them (participant indices).
  std::vector<size_t> MarkNextWaveLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues CommitSync to `parts` (the failpoint may stop it after N).
  void PushCommitsLocked(SyncRecord& sync, const std::vector<size_t>& parts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once the current wave is done: starts the next one (saved, then sent),
  // and the one after while a started wave holds nothing back; none past
  // the deadline. Also from Tick (a lost receiver's hold ends).
  void AdvanceRolloutLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks, saves and sends the next wave; false when none is due.
  bool PushNextWaveLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // sync.status.rollout from the replicas' phases.
  void RefreshRolloutLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The destination rank of `p` in `sync`'s transfer (-1: none).
  int32_t DestinationRankLocked(const SyncRecord& sync, const Participant& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Receiver `p` confirmed (`committed`) or will not confirm the commit of
  // `sync`: the controller's view of what its rank serves (and, with
  // `export_metric`, the transfer's replica gauges).
  void NoteServedLocked(const SyncRecord& sync, const Participant& p, bool committed,
                        bool export_metric = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // wsync_replica_committed_version of every replica of `t`.
  void ExportServedLocked(const Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An in-place sync succeeded: every destination rank serves its version.
  void NoteInPlaceSucceededLocked(const SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per replica of `t`'s destination, the version it serves (controller's view).
  std::vector<v1::ReplicaVersion> ServedReplicasLocked(const Transfer& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ----- sync_coordinator.cc
  // The control-path times of one worker's report, into sync.status.
  void RecordControlPath(SyncRecord& sync, const Participant& p, const v1::ReportResultRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed report from participant `p`: ends the sync at once, or (a
  // failure about peers) leaves it to SettleLocked.
  void FailedReportLocked(SyncRecord& sync, Participant& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a sync whose failure awaited attribution, or that is past its
  // deadline (see the top).
  void SettleLocked(SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first failed report, for the error of a sync that settles on
  // another cause ("" when none).
  std::string FirstReportLocked(const SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed sync whose first report blamed its peers names participant
  // `lost` as its cause once it is declared lost (shortly after).
  void BlameLostPeerLocked(SyncRecord& sync, const Participant& lost, const WorkerLoss& loss)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a running sync; for failures `cause` names the worker (or -1).
  void FinishLocked(SyncRecord& sync, v1::SyncPhase phase, int32_t code, const std::string& error,
                    int32_t cause_worker, int32_t round, int32_t op, int32_t peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::SyncStatus SnapshotLocked(const SyncRecord& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancel: FAILED_PRECONDITION once the commit of `sync` is decided (its
  // receivers commit whatever the trainer says; docs/staging.md).
  absl::Status CheckCancellableLocked(const SyncRecord& sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT naming the worker when a report claims more bytes than
  // the plan writes into it (or a negative count).
  absl::Status CheckBytesLocked(const Participant& p, int64_t bytes_done, absl::string_view method)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int64_t PlannedBytesInto(const v1::Plan& plan, int32_t worker);

  const ControllerConfig config_;
  ControllerMetrics* const metrics_;
  PlanSource* const plans_;
  WorkerRegistry* const workers_;
  Rendezvous* const rendezvous_;
  StateStore* const store_;
  ReplicaLabeler labeler_;  // set before sharing (SetReplicaLabeler)

  StepsFallbackLog steps_fallback_log_;  // Resolve's: steps cleared for an older worker
  absl::Mutex mu_;
  ChangeSignal cv_;  // sync changes
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Sync ids below this came from an earlier instance (Restore); 0: none.
  uint64_t first_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  // Transfer name -> what its last started sync prepared (see Prepared).
  absl::flat_hash_map<std::string, std::shared_ptr<const Prepared>> prepared_ ABSL_GUARDED_BY(mu_);
  // Shared: a waiter keeps its record while Tick may prune it.
  absl::flat_hash_map<std::string, std::shared_ptr<SyncRecord>> syncs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> sync_order_ ABSL_GUARDED_BY(mu_);  // for pruning
  // Ids of the latest warm-ups replaced by newer ones (their late reports).
  std::deque<std::string> earlier_warm_ups_ ABSL_GUARDED_BY(mu_);
  PartCache parts_;  // worker parts of plans, unrouted and routed (built outside mu_)
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_SYNC_COORDINATOR_H_
