// Runs the syncs assigned to this worker, one at a time: looks up (or caches)
// the op list by plan key, binds it to the owner-registered buffers, gets the
// transfer's channel from the DataPlane (worker/node/data_plane.h: built from
// the worker's backend once per transport generation, rendezvous through the
// controller), and replays the op list with the channel's Executor.
// Abort() may come from any thread.
#ifndef WSYNC_WORKER_AGENT_SYNC_RUNNER_H_
#define WSYNC_WORKER_AGENT_SYNC_RUNNER_H_

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "worker/agent/part_cache.h"
#include "worker/agent/peer_buffers.h"
#include "worker/agent/shadow_set.h"
#include "worker/agent/tensor_table.h"
#include "worker/agent/worker_metrics.h"
#include "worker/exec/buffer_registry.h"
#include "worker/exec/executor.h"
#include "worker/exec/verify_pass.h"
#include "worker/node/data_plane.h"
#include "worker/plane/backend.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::agent {

struct RunnerOptions {
  absl::Duration round_timeout = absl::Seconds(60);
  int64_t staging_limit_bytes = 0;  // ExecutorOptions::staging_limit_bytes
  // Not owned, never null: the memory the buffers live in and what moves it.
  plane::Backend* backend = nullptr;
  // The cached parts' budget (PartCache, --parts_cache_bytes).
  int64_t parts_cache_bytes = int64_t{256} << 20;
  // Staged syncs: the most shadow memory (--staging_budget_bytes; 0: no limit).
  int64_t staging_budget_bytes = 0;
  // Test only (AgentOptions::test_corrupt_after_sync): "<group>/<tensor>"
  // whose first live byte is flipped before each verify pass of a sync this
  // worker receives; "": off.
  std::string test_corrupt_after_sync;
  // Not owned, may be null: the owner's weight arenas (an embedded worker's,
  // weight_arenas.h); a staged part whose destinations lie in one commits by
  // swapping (docs/commit-swap.md).
  WeightArenas* arenas = nullptr;
  // ExecutorOptions::put_gate_timeout (--put_gate_timeout; 0: no phase
  // gates).
  absl::Duration put_gate_timeout = absl::Milliseconds(100);
};

// The part key of an assignment (plan key, worker, routes); older
// controllers send none.
std::string PartIdOf(const v1::SyncAssignment& a);

class SyncRunner {
 public:
  // progress(rounds_done, rounds_total, bytes_into_this_worker)
  using ProgressFn = std::function<void(int32_t, int32_t, int64_t)>;

  SyncRunner(TensorTable* tensors, WorkerMetrics* metrics, RunnerOptions options);

  // Runs one assignment to the end (success, failure, abort or deadline) and
  // returns the report for the controller (lease id left empty).
  v1::ReportResultRequest Run(const v1::SyncAssignment& a,
                              std::shared_ptr<v1::WorkerService::Stub> stub,
                              const std::string& lease_id, const ProgressFn& progress);

  // A warm-up assignment (a.warm_up(), docs/warm-up.md): everything Run does
  // but move data. Caches the op list, binds it (shadows too, for a staged
  // transfer), maps the direct-write peers, builds the transfer's channel
  // (the transport's rendezvous through the controller) and has its
  // executor allocate staging and greet every peer (Executor::WarmUp). The
  // next sync of the same part and generation finds all of it ready. Returns
  // the report (warm_up set; lease id left empty); touches no tensor, no
  // version, no sync metric. Abort() ends it like a sync.
  v1::ReportResultRequest WarmUp(const v1::SyncAssignment& a,
                                 std::shared_ptr<v1::WorkerService::Stub> stub,
                                 const std::string& lease_id);

  // Channels (transports) this runner built so far, warm-ups included.
  int64_t channels_created() const { return plane_.channels_created(); }

  // Caches the op list `a` carries (if any) without running it, for an
  // assignment dropped before it ran: the controller sends each part once.
  // Call from the thread that calls Run.
  void CachePlan(const v1::SyncAssignment& a);

  // Aborts sync `sync_id` if it is running (empty: whatever runs).
  void Abort(const std::string& sync_id, const std::string& reason);

  // Drops every transport (e.g. after the lease was lost).
  void DropTransports();

  // Staged syncs (docs/staging.md). A staged assignment's Run writes the
  // shadows and, on success, reports `staged` (a receiver) with its bucket
  // checksums; the caller then commits or discards. Call from Run's thread.
  // Copies the shadows into the live tensors (the receiver's pause); a flip
  // commit (ShadowSet::flipped) moves the live tensors onto the flip
  // partner instead and records the flip of `sync_id` for the owner's
  // acknowledgement (WeightArenas::Flipped).
  absl::Status CommitStaged(const std::string& sync_id);
  // The arena handle the owner serves from after the last commit, if it
  // was a flip; 0 otherwise.
  int64_t flipped_onto() const { return flipped_onto_; }
  // After a swap commit, once the pause is over: the twin's half of the
  // swap (ShadowSet::FinishSwap). Call from Run's thread.
  absl::Status FinishStagedSwap() { return shadows_.FinishSwap(); }
  // How the pending commit runs ("swap", "flip" or "copy";
  // ShadowSet::commit_kind).
  const char* commit_kind() const { return shadows_.commit_kind(); }
  // The shadows hold part of a version: refilled before their next use.
  void DiscardStaged() {
    commit_pending_ = false;
    shadows_.Discard();
  }
  // A staged receiver's Run staged and its commit (or discard) is pending.
  // Meanwhile Run refuses (FAILED_PRECONDITION: nothing may write the
  // tensors or shadows a pending commit copies) and WarmUp touches neither
  // the shadows (a staged transfer's warm-up binds the live buffers; its
  // sync binds the shadows again) nor the registered buffers' snapshot (the
  // shadows' live pointers stay mapped).
  bool commit_pending() const { return commit_pending_; }

  // Verify mode (docs/staging.md, "Verify"; sync_runner_verify.cc): after
  // the commit of staged sync `a`, hashes what the live tensors hold for
  // every bucket this worker received and its local copies, into its
  // committed report `r`. (Run does the rest: a sender's sources, and all
  // of an in-place sync.) Call from Run's thread.
  absl::Status VerifyCommitted(const v1::SyncAssignment& a, v1::ReportResultRequest* r);
  // Verify passes run so far (0 while no transfer has verify on).
  int64_t verify_passes() const { return verify_passes_.load(); }

 private:
  // A part bound for a run: the plan, the registry it is bound to (the
  // shadows' for a staged receiver) and whether it stages.
  struct BoundPart {
    std::shared_ptr<const exec::BoundPlan> plan;
    const exec::BufferRegistry* registry = nullptr;
    bool staged = false;
  };
  // The routed part's key (plan key, worker, routes); older controllers send
  // none.
  static std::string PlanId(const v1::SyncAssignment& a);
  // Marks `a` running (taking an abort that came early) and starts its report.
  v1::ReportResultRequest Begin(const v1::SyncAssignment& a);
  // Binds `part` for `a` (cached per part and peer mappings); sets
  // r->direct_writes_unavailable when the peers cannot be mapped.
  absl::StatusOr<BoundPart> Bind(const v1::SyncAssignment& a, const v1::Plan& part,
                                 v1::ReportResultRequest* r);
  // Run / WarmUp's end: clears the running state.
  void End();
  absl::Status RefreshRegistry();
  // BufferListFingerprint of the registered buffers (cached per snapshot).
  uint64_t OwnBuffersFingerprint();
  // The assignment's direct writes, with the peers' buffers mapped; *key
  // identifies them for the bound-plan cache (empty: none).
  absl::Status PrepareDirectWrites(const v1::SyncAssignment& a, exec::DirectWrites* direct,
                                   std::string* key);
  std::string AbortReason();
  // A verify pass over `plan` on `sides`, into `r`; with the test
  // failpoint, corrupts its tensor first when the pass covers received data.
  absl::Status VerifyInto(const exec::BoundPlan& plan, exec::VerifySides sides,
                          v1::ReportResultRequest* r);
  absl::Status CorruptForTest();
  // For a staged assignment: prepares the shadows of the destination buffers
  // `part` writes and returns the registry to bind against (the live one
  // otherwise); *staged tells whether this worker writes any.
  absl::StatusOr<const exec::BufferRegistry*> RegistryFor(const v1::SyncAssignment& a,
                                                          const v1::Plan& part, bool* staged);
  // "worker N group/rank ...", for errors.
  static std::string WhoOf(const v1::SyncAssignment& a);
  // FAILED_PRECONDITION naming `who`, the tensor and the arena when a
  // buffer `part` names lies in a weight arena a failed swap left unusable.
  absl::Status CheckArenasUsable(const v1::Plan& part, const std::string& who) const;
  absl::StatusOr<node::Channel*> EnsureChannel(const v1::SyncAssignment& a,
                                               std::shared_ptr<v1::WorkerService::Stub> stub,
                                               const std::string& lease_id);

  TensorTable* const tensors_;
  WorkerMetrics* const metrics_;
  const RunnerOptions options_;

  // Owned by the running thread.
  PartCache parts_;  // by part key ("<key>/<worker>" from older controllers)
  exec::BufferRegistry registry_;
  TensorSnapshot snapshot_;  // keeps mappings alive for the registry
  bool have_snapshot_ = false;
  // BufferListFingerprint of snapshot_'s buffers (the token peers check
  // before writing here), computed once per registry version.
  uint64_t own_fingerprint_ = 0;
  uint64_t own_fingerprint_version_ = std::numeric_limits<uint64_t>::max();
  PeerMapsByTransfer peers_;  // direct writes: the peers' buffers
  // "<key>/<worker>" -> (direct-writes key, the plan bound with them).
  std::map<std::string, std::pair<std::string, std::shared_ptr<const exec::BoundPlan>>> bound_;
  node::DataPlane plane_;        // the transfers' channels
  ShadowSet shadows_;            // staged syncs
  int64_t flipped_onto_ = 0;     // CommitStaged's flip, or 0
  bool commit_pending_ = false;  // commit_pending()

  absl::Mutex mu_;
  std::string running_ ABSL_GUARDED_BY(mu_);
  exec::Executor* running_executor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  // Aborts that arrived before their sync started running.
  std::map<std::string, std::string> early_aborts_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> verify_passes_{0};
  std::unique_ptr<exec::DataOps> verify_ops_;  // made at the first verify pass
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_SYNC_RUNNER_H_
