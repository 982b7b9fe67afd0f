// The op-list interpreter: runs one worker's bound plan round by round over a
// Transport and DataOps. Within a round:
//   1. pack every staged SEND bucket (cast to the wire dtype), synchronize;
//   2. post all sends and receives in one Transport::RunRound, in (peer, seq)
//      order with tag = bucket id (zero-copy buckets go straight from / into
//      the tensors);
//   3. unpack received buckets, run COPYs, then REDUCEs; synchronize.
// Pipelined (ExecutorOptions::pipeline, the default), with the data ops'
// calls being asynchronous (a device stream), the interpreter overlaps:
//   * a round's local COPYs and all-local REDUCEs are issued between 1 and 2
//     so they run during the transfer;
//   * round r+1 is packed into the second staging set between 1 and 2 of
//     round r, so packing runs during round r's transfer;
//   * round r's step 3 is issued during round r+1's transfer.
// Overlapping work is issued once the transfer is posted (Transport::RunRound's
// on_posted), so a GPU runs NCCL's kernels first and the data ops' kernels
// beside them.
// Each only where pipeline_schedule.h proves it touches no memory the round
// writes later (relays re-sending what round r received are packed after).
// Staging is then one allocation used from both ends (even rounds from the
// start, odd rounds from the end), at most twice the plan's peak, or
// ExecutorOptions::staging_limit_bytes where set; without pipelining one
// allocation of the plan's peak. Both are reused across rounds and syncs.
//
// Direct writes (BoundPlan.puts, bound_plan.h DirectWrites): before round 0
// the worker exchanges ready tokens (receivers -> the senders that write
// them), queuing the leading rounds that only copy locally once the tokens
// are posted; it then issues the puts (PeerWriter::Put: beside the rounds,
// no staging; phase by phase through phase gates, phase_gates.h, where the
// tokens use mailboxes), runs the other rounds, fences the puts, sends done
// tokens and waits for its local work. A receiver's sync ends only after its
// done tokens arrived.
//
// Tokens travel through peer mailboxes (PeerWriter's mailbox contract) where
// the writer has them and ExecutorOptions::mailbox_tokens is on, else as
// transport rounds (PeerWriter token slots). Mailboxes: the first sync (or
// warm-up) with a direct-write peer not met before exchanges mailbox
// descriptors with such peers in one transport round (tag kMailboxTag);
// from then on each worker's mailbox holds, per peer worker id w, five
// slots: 5w = the ready sequence w posted, 5w+1 its registration fingerprint
// (posted first), 5w+2 the done sequence w posted after fencing its puts,
// 5w+3 (with checksums) how many parts of w's puts into it landed, 5w+4
// the first put phase w has not finished (phase gates, phase_gates.h). A
// sync's sequence with a peer is a per-peer counter both sides advance on
// every sync between them, starting at 1 on a fresh executor. Precondition:
// both sides run every such sync, which holds because any failed sync
// makes the controller open a new transport generation, so every worker of
// the transfer builds a new channel (transport, writer and executor) before
// the next (the failing worker drops its own at once); the executor refuses
// direct writes after a failed direct-write sync (FAILED_PRECONDITION). A
// side whose Run fails (its checks, its staging, the tokens, a put, a round,
// its local work) posts this sync's sequence with kMailboxFailed set to
// every peer still waiting for a token from it, so those end at once; a
// token it already posted is never overwritten (that peer's part stands). A
// failure before Run (the caller's binding) posts nothing: its peers end
// when the controller aborts the sync. A value from another sequence is an
// error naming it, and polls end at the round's deadline or on Abort (a
// killed peer: bounded). Every error of the mailbox steps on an aborted
// executor is CANCELLED, as a round's is.
//
// Direct writes with checksums (executor_direct_hash.cc): each side hashes
// every direct-write bucket from its views in wire order
// (DataOps::QueueWireChecksum, BoundPlan::direct_buckets): the writer its
// sources right after issuing the puts (beside them), the receiver its
// destinations once they landed. With mailbox tokens, the buckets of each
// (writer, receiver) pair, in (round, seq) order, are cut by running bytes
// into up to landing_parts parts of at least min_landing_part_bytes, shrinking
// toward the end by direct_part_tail_ratio (direct_parts.h);
// the writer issues its puts one part at a time with a mark after each
// (PeerWriter::Mark) and, as each mark is reached, posts the part count into
// slot 5w+3 of its receivers' mailboxes, so a receiver hashes part k while
// later parts move: only the last part's hash follows the transfer. With
// token rounds the receiver hashes after the done tokens.
//
// A failed sync leaves destination buffers partly written: the caller must
// not publish them (staged commit comes later). Any failure also leaves the
// transport unusable (see Transport::RunRound).
#ifndef WSYNC_WORKER_EXEC_EXECUTOR_H_
#define WSYNC_WORKER_EXEC_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/phase_gates.h"
#include "worker/exec/pipeline_schedule.h"
#include "worker/plane/data_ops.h"
#include "worker/plane/peer_writer.h"
#include "worker/plane/transport.h"

namespace wsync::exec {

struct ExecutorOptions {
  // Each round's transfer must finish within this (and within the sync's
  // deadline).
  absl::Duration round_timeout = absl::Seconds(60);
  // Overlap packing and local work with transfers (see above); off: plain
  // round order with half the staging memory.
  bool pipeline = true;
  // > 0: staging memory never exceeds this (rounded down to 256 bytes);
  // neighbouring rounds that do not fit together run one after the other. A
  // plan round that alone needs more is refused. 0: up to two rounds' worth.
  int64_t staging_limit_bytes = 0;
  // With direct writes: how many of the leading rounds that only copy
  // locally are queued while the ready tokens travel (-1: all); the rest
  // follow the puts. One keeps the device busy while the tokens travel and
  // issues the puts right after them (docs/direct-writes.md).
  int early_local_rounds = 1;
  // With checksums: the landing parts asked of the transport
  // (transport::RoundHooks), so that a receiver hashes part k while part k+1
  // moves, and the parts of direct writes (see above). Every worker of a
  // transfer must use the same two values (both sides of a pair must cut
  // alike); 1 part: hashes after each round (after the puts).
  int32_t landing_parts = 16;
  int64_t min_landing_part_bytes = int64_t{64} << 20;
  // The parts of direct writes shrink toward the end of each pair's stream
  // by this ratio, the last planned at min_landing_part_bytes
  // (direct_parts.h, DirectPartCut::tail_ratio), so that the receiver's
  // hash after the last part lands is short; <= 1: equal parts. The same on
  // every worker, as the two above.
  int32_t direct_part_tail_ratio = 4;
  // Direct-write tokens through peer mailboxes (see above) where the peer
  // writer has them; off: a transport round each (the A/B baseline). Every
  // worker of a transfer must use the same value.
  bool mailbox_tokens = true;
  // Phase gates between the put phases (phase_gates.h) where the tokens go
  // through mailboxes and the puts are not cut into checksum parts; a gate
  // whose peers stay silent opens after put_gate_timeout (> 0).
  bool put_phase_gates = true;
  absl::Duration put_gate_timeout = absl::Milliseconds(100);
};

struct Progress {
  int32_t worker = 0;
  // The round just finished, or kDirectWrites once every direct write to or
  // into this worker is done (after the last round).
  static constexpr int32_t kDirectWrites = -1;
  int32_t round_index = 0;
  int32_t rounds_done = 0;
  int32_t rounds_total = 0;
  int64_t bytes_done = 0;  // sent + received + copied so far
  int64_t bytes_total = 0;
};
// Called on Run's thread, never while a transport round is in flight (it may
// block); rounds queued during the ready tokens are reported together, once
// the puts are issued.
using ProgressCallback = std::function<void(const Progress&)>;

struct RoundStats {
  int32_t index = 0;
  double pack_seconds = 0;
  double transfer_seconds = 0;
  double unpack_seconds = 0;
  double copy_seconds = 0;
  double reduce_seconds = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t bytes_local = 0;
  int64_t staging_bytes = 0;
  int32_t sends = 0;
  int32_t recvs = 0;
  int32_t messages = 0;  // transport messages posted (runs of buckets with one peer)
  int32_t copies = 0;
  int32_t reduces = 0;
};

// A bucket's wire-byte checksum (common/chunk_hash.h, DataOps::Checksum),
// taken when checksums are on (Executor::set_checksums): a sent bucket after
// its pack (beside the transfer), a received one before its unpack. Zero-copy
// buckets hash the tensor range they go from / into; direct-write buckets
// the views they are written from / into (see above). Receives are hashed as
// they land where the transport reports landing parts (RoundHooks::on_landed:
// NCCL cuts each peer's list into up to ExecutorOptions::landing_parts steps,
// and the data ops' stream hashes part k behind its event while later parts
// move) in rounds that end with a wait (the last one, or one whose unpack the
// next round needs); the last part's, those of rounds that finish during the
// next transfer, and all where the transport names none, with the unpack.
struct BucketChecksum {
  int64_t bucket = 0;
  uint64_t hash = 0;
  bool sent = false;
};

struct SyncStats {
  std::vector<RoundStats> rounds;
  // In round order (transport buckets), then the direct-write buckets.
  std::vector<BucketChecksum> checksums;
  // Received buckets hashed as their landing part arrived, before their round
  // ended (RoundHooks::on_landed).
  int32_t recv_hashes_as_landed = 0;
  // Direct-write buckets received and hashed as their part's count arrived
  // (each part but the last: the writer's later parts were still moving or
  // unconfirmed), and the parts of this worker's puts it posted.
  int32_t direct_hashes_as_landed = 0;
  int32_t direct_parts_posted = 0;
  // Bytes of the direct-write buckets received and hashed only after the
  // writer's last part landed: the receiver's hash tail.
  int64_t direct_tail_hash_bytes = 0;
  double seconds = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t bytes_local = 0;
  int64_t peak_staging_bytes = 0;  // most staging in use at once (two rounds when pipelined)
  int32_t rounds_packed_ahead = 0;
  int32_t rounds_local_early = 0;
  int32_t rounds_finished_async = 0;  // post-transfer work overlapped the next transfer
  // Direct writes (included in bytes_sent / bytes_received above).
  int64_t bytes_put = 0;
  int64_t bytes_put_into = 0;
  double put_issue_seconds = 0;
  double put_wait_seconds = 0;     // after the last round, until every put finished
  double token_seconds = 0;        // exchanging ready and done tokens with the peers
  double ready_token_seconds = 0;  // of which the ready tokens (and queuing local rounds)
  double local_wait_seconds = 0;   // after the done tokens, until the local work finished
  // Mailbox reads while waiting for ready and done tokens (0 on token
  // rounds), and whether this sync exchanged mailbox descriptors.
  int64_t mailbox_polls = 0;
  bool mailbox_exchanged = false;
  // Phase gates this sync issued, and those that opened by their timeout.
  int32_t put_gates = 0;
  int64_t put_gates_timed_out = 0;
};

class Executor {
 public:
  // Not owned; all must outlive the executor. The transport's ranks are
  // worker ids. `writer` may be null: plans with direct writes are then
  // refused.
  Executor(transport::Transport* transport, DataOps* ops, PeerWriter* writer,
           ExecutorOptions options = {});

  // Runs one sync. `registry_generation` is the registry's current generation:
  // a plan bound against another generation is refused (FAILED_PRECONDITION:
  // rebind). Errors name the round, phase, buckets and peers.
  absl::StatusOr<SyncStats> Run(const BoundPlan& plan, uint64_t registry_generation,
                                absl::Time deadline, const ProgressCallback& progress = nullptr);

  // A warm-up (docs/warm-up.md): does everything Run does before its first
  // byte, moving no data. Checks `plan` as Run does, builds its schedule and
  // prepared lists, allocates its staging, and exchanges one kTokenBytes
  // message (tag kWarmUpTag) with every peer the plan has (transfers either
  // way, direct-write peers), so that a transport connecting peer pairs on
  // their first message (NCCL) has connected them. The peers must warm up
  // their own parts of the same routed plan (the peer sets are symmetric).
  // With mailbox tokens it then exchanges the mailbox descriptors with the
  // direct-write peers not met before (a second round), so the first sync
  // posts its tokens at once. Returns how many peers it greeted; errors as Run's (a failure leaves
  // the transport unusable).
  absl::StatusOr<int32_t> WarmUp(const BoundPlan& plan, uint64_t registry_generation,
                                 absl::Time deadline);

  // From any thread: ends a Run in flight promptly (CANCELLED) and every later
  // one; the transport is aborted too and must be rebuilt with the executor.
  void Abort(const std::string& reason);

  // Staging in use (the round in flight, plus the next one while it is packed
  // ahead; 0 outside Run) and allocated.
  int64_t current_staging_bytes() const { return current_staging_.load(); }
  int64_t allocated_staging_bytes() const { return allocated_staging_.load(); }
  // Frees the staging allocation (e.g. while idle between syncs).
  void ReleaseStaging();
  // Checksums of every network bucket of the next Runs (SyncStats.checksums);
  // call between Runs.
  void set_checksums(bool on) { checksums_ = on; }

 private:
  // What one round leaves to the next.
  struct Carry {
    bool packed = false;    // the next round's staging was packed ahead
    bool deferred = false;  // the round's post-transfer work is still to be issued
  };
  // One Run's progress through its plan.
  struct SyncState {
    SyncState(const BoundPlan& plan, absl::Time deadline, const ProgressCallback& progress);
    const BoundPlan& plan;
    const absl::Time deadline;
    const ProgressCallback& progress;
    SyncStats stats;
    Progress p;
    Carry carry;      // what the last round run left to the next
    size_t next = 0;  // the next round to run
    // Progress of rounds queued while a transport round is in flight is
    // reported after it: the callback may block (the worker reports over
    // gRPC).
    bool hold_progress = false;
    bool progress_held = false;
  };
  // Runs plan.rounds[sync.next] and counts it; the caller cleans up on
  // failure.
  absl::Status Step(SyncState& sync);
  // After a failure: nothing issued so far outlives the sync (staging may be
  // freed or reused next, peer mappings closed); their own errors are
  // secondary. Never while a transport round is in flight: the data ops may
  // free memory there, which waits for the whole device (retired_memory.h).
  void CleanUpAfterFailure(bool direct);
  // Runs plan.rounds[i]. `carry` holds what round i-1 left (round i packed
  // ahead; round i-1's post-transfer work, issued during this transfer) and
  // receives what round i leaves to round i+1.
  absl::Status RunRound(const BoundPlan& plan, size_t i, absl::Time deadline, Carry& carry,
                        RoundStats& stats, SyncStats& sync);
  // Round `round`'s sends and receives in one transport round (runs of
  // staged buckets with one peer as one message); `on_posted` as in
  // Transport::RunRound.
  absl::Status Transfer(const BoundPlan& plan, size_t i, uint8_t* staging, absl::Time deadline,
                        const std::function<void()>& on_posted, RoundStats& rs);
  // With checksums_: queues the hash of buckets `round` sends on the data
  // ops (DataOps::QueueChecksum), one slot each: those whose bytes are final
  // once the round is posted, or (`relayed_in_round`) the zero-copy ones of
  // later steps, final once its transfer ended (received buckets are hashed
  // by HashLanded / HashReceivedNotLanded); CollectHashes fills
  // sync.checksums once the run's work is done.
  absl::Status HashSentBuckets(const BoundPlan& plan, const BoundRound& round, uint8_t* staging,
                               bool relayed_in_round);
  absl::Status HashBucket(const BoundPlan& plan, const BoundRound& round, const BoundTransfer& t,
                          uint8_t* staging, bool sent);
  // The transport's on_landed for round j: the data ops wait for `mark`,
  // then hash the buckets of the named receive messages (recv_spans_).
  absl::Status HashLanded(const BoundPlan& plan, size_t j, uint8_t* staging,
                          absl::Span<const size_t> requests, const transport::LandingMark& mark);
  // Round j's received buckets not hashed as they landed.
  absl::Status HashReceivedNotLanded(const BoundPlan& plan, size_t j, uint8_t* staging);
  absl::Status ResetHashes(const BoundPlan& plan);
  absl::Status CollectHashes(SyncStats& sync);
  // Whether round i's post-transfer work is issued during round i+1's
  // transfer (pipelined and the schedule allows it).
  bool FinishesAsync(const BoundPlan& plan, size_t i) const;
  // Staging of round j in the current allocation.
  uint8_t* StagingOf(size_t j) const;
  // Waits for every data op issued so far; an error names `where` and the
  // rounds whose local work was queued without a wait since then.
  absl::Status WaitForDataOps(const std::string& where);
  // Round j's COPYs and all-local REDUCEs.
  absl::Status IssueLocal(const BoundPlan& plan, size_t j, uint8_t* staging, RoundStats& rs);
  // Round j's work after its transfer: unpack, late local work, staged REDUCEs.
  absl::Status IssueAfterTransfer(const BoundPlan& plan, size_t j, uint8_t* staging,
                                  RoundStats& rs);
  // Run's checks of the plan against this executor (FAILED_PRECONDITION).
  absl::Status CheckRunnable(const BoundPlan& plan, uint64_t registry_generation,
                             bool direct) const;
  // The plan's schedule (and prepared lists), and staging enough for it.
  absl::Status PrepareStaging(const BoundPlan& plan);
  absl::StatusOr<const PipelineSchedule*> ScheduleFor(const BoundPlan& plan);
  absl::Status CheckAborted(const BoundPlan& plan, const BoundRound& round, const char* phase);
  // Direct writes: one transport round of tokens between this worker and its
  // direct-write peers (see bound_plan.h, DirectWrites).
  // `on_posted` as in Transport::RunRound.
  absl::Status ExchangeTokens(const BoundPlan& plan, bool ready, absl::Time deadline,
                              const std::function<void()>& on_posted);
  // Before round 0: the ready tokens (`on_ready_posted` runs once they are
  // posted; its error wins), then every put at once.
  absl::Status StartDirectWrites(const BoundPlan& plan, absl::Time deadline,
                                 const std::function<absl::Status()>& on_ready_posted,
                                 SyncStats& stats);
  // After the last round: fences the puts, sends the done tokens and waits
  // for the local work.
  absl::Status FinishDirectWrites(const BoundPlan& plan, absl::Time deadline, SyncStats& stats);

  // Mailboxes (executor_mailbox.cc). `s` (not OK) with `where`; CANCELLED
  // when the executor was aborted (the step's error comes after).
  absl::Status MailboxError(const absl::Status& s, const std::string& where);
  // Whether this sync's tokens use them.
  bool UseMailbox(const BoundPlan& plan) const;
  // Exchanges descriptors with the plan's direct-write peers not met before
  // (one transport round; none if all were met).
  // `on_posted` as in Transport::RunRound (not called without a round).
  absl::Status EnsureMailboxes(const BoundPlan& plan, absl::Time deadline,
                               const std::function<void()>& on_posted, SyncStats* stats);
  // Advances the sequence of every direct-write peer of `plan` into
  // mailbox_seq_.
  absl::Status BeginMailboxSync(const BoundPlan& plan);
  // Ready: posts to the writers, runs `on_posted`, then waits for the
  // receivers' and checks their fingerprints. Done: posts to the receivers,
  // waits for the writers'.
  absl::Status MailboxReady(const BoundPlan& plan, absl::Time deadline,
                            const std::function<void()>& on_posted, SyncStats& stats);
  absl::Status MailboxDone(const BoundPlan& plan, absl::Time deadline, SyncStats& stats);
  // Polls slot 3 * peer + offset of this worker's mailbox until it holds
  // `want`; errors name `where` and the peer.
  absl::Status AwaitSlot(const std::string& where, int32_t peer, int64_t offset, uint64_t want,
                         absl::Time deadline, SyncStats& stats);
  // After a failed direct-write sync on mailboxes: the peers still waiting
  // learn it, and later direct-write syncs are refused (BeginMailboxSync).
  void PostMailboxFailure(const BoundPlan& plan);
  std::string TokenWhere(const BoundPlan& plan, bool ready) const;

  // Direct writes with checksums (executor_direct_hash.cc; see above).
  // Per plan (from ScheduleFor): the parts, the put steps and the prepared
  // hash lists.
  void PrepareDirectParts(const BoundPlan& plan);
  // Whether this sync's puts go in parts (checksums over mailboxes).
  bool SplitPuts(const BoundPlan& plan) const;
  // Whether this sync's puts go through phase gates (ExecutorOptions).
  bool UseGates(const BoundPlan& plan) const;
  // Issues the puts (through phase gates when UseGates, in parts when
  // SplitPuts), then queues the hashes of the buckets this worker writes.
  absl::Status IssuePuts(const BoundPlan& plan, bool alone, SyncStats& stats);
  // Queues the hash of plan.direct_buckets[d].
  absl::Status QueueDirectHash(const BoundPlan& plan, size_t d);
  // Posts each part of this worker's puts as its mark is reached and hashes
  // each part its writers posted, until both are through.
  absl::Status PumpDirectParts(const BoundPlan& plan, absl::Time deadline, SyncStats& stats);
  // With token rounds: every received direct-write bucket, after the done
  // tokens.
  absl::Status HashDirectReceived(const BoundPlan& plan);
  // Hashes the buckets written by `writer` in parts [from, to).
  absl::Status HashWriterParts(const BoundPlan& plan, int32_t writer, int32_t from, int32_t to,
                               SyncStats& stats);

  // Tags of the token messages: bucket ids are >= 0.
  static constexpr int64_t kReadyTokenTag = -1;
  static constexpr int64_t kDoneTokenTag = -2;
  static constexpr int64_t kWarmUpTag = -3;
  static constexpr int64_t kMailboxTag = -4;
  // Set in a posted sequence by a side that failed that sync.
  static constexpr uint64_t kMailboxFailed = uint64_t{1} << 63;

  transport::Transport* const transport_;
  DataOps* const ops_;
  PeerWriter* const writer_;
  const ExecutorOptions options_;
  StagingBuffer staging_;
  // The first round of the current sync whose work was queued without a
  // wait after it (rounds without transfers), or -1.
  int32_t unwaited_round_ = -1;
  // The last round leaves its wait to Run (direct writes).
  bool hold_last_wait_ = false;
  bool checksums_ = false;
  std::vector<BucketChecksum> queued_hashes_;  // by slot: bucket and side, hash unset
  // With checksums_: by round, by receive bucket, whether it was hashed as
  // its landing part arrived.
  std::vector<std::vector<uint8_t>> recv_hashed_;
  int32_t hashed_as_landed_ = 0;
  std::atomic<int64_t> current_staging_{0};
  std::atomic<int64_t> allocated_staging_{0};
  std::atomic<bool> aborted_{false};
  absl::Mutex mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  std::vector<transport::SendRequest> send_reqs_;
  std::vector<transport::RecvRequest> recv_reqs_;
  std::vector<std::pair<size_t, size_t>> recv_spans_;  // recv_reqs_[i]'s buckets in round.recvs
  // The schedule of the last plan run, and the BoundPlan::instance of the plan schedule_ was built
  // for (0: none). Not its address: a rebound plan may be allocated where the old one was.
  uint64_t schedule_instance_ = 0;
  PipelineSchedule schedule_;
  // The prepared lists of that plan: each round's copies, and the puts.
  std::vector<ItemsHandle> copy_handles_;
  ItemsHandle put_handle_;
  // Mailboxes: whether this worker's exists, the peers whose mailboxes are
  // open here (and who opened this one), each peer's sequence of the current
  // or last sync, and whether a direct-write sync failed (sequences unknown).
  bool mailbox_created_ = false;
  std::string mailbox_descriptor_;
  std::set<int32_t> mailbox_peers_;
  std::map<int32_t, uint64_t> mailbox_seq_;
  std::map<int64_t, uint64_t> mailbox_seen_;  // by own slot: the value last consumed
  bool mailbox_sync_ = false;                 // the current sync's tokens use the mailboxes
  bool mailbox_begun_ = false;                // the current sync advanced mailbox_seq_
  // The peers the current sync posted its ready / done token to (a failure
  // marker never overwrites one).
  std::set<int32_t> ready_posted_;
  std::set<int32_t> done_posted_;
  bool direct_failed_ = false;
  // Direct writes with checksums: each direct bucket's part in its pair and
  // prepared hash list; each pair's part count (by receiver, by writer);
  // the put steps (step k: the puts of its part-k buckets) with their
  // prepared lists; the marks of this sync's steps.
  std::vector<int32_t> direct_part_;
  std::vector<ItemsHandle> direct_hash_handles_;
  std::map<int32_t, int32_t> parts_to_;
  std::map<int32_t, int32_t> parts_from_;
  std::vector<std::vector<CopyItem>> step_puts_;
  std::vector<std::vector<int32_t>> step_put_index_;  // each step item's index in plan.puts
  std::vector<ItemsHandle> step_handles_;
  std::vector<uint64_t> step_marks_;
  PhaseGates phase_gates_;  // of the plan schedule_ was built for
  int64_t gates_timed_out_before_ = 0;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_EXECUTOR_H_
