// A plan bound to one worker's buffers: every view resolved to memory and
// checked (inside its buffer, dtype as registered), every op turned into the
// data-op items and transport requests the executor replays. Bind once per
// (plan, registry generation); replay on every sync.
#ifndef WSYNC_WORKER_EXEC_BOUND_PLAN_H_
#define WSYNC_WORKER_EXEC_BOUND_PLAN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/exec/buffer_registry.h"
#include "worker/plane/data_ops.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::exec {

// One network bucket on this worker: staged at staging_offset, or (zero-copy)
// sent from / received into `direct` in the tensor itself.
struct BoundTransfer {
  int64_t bucket = 0;
  int32_t peer = 0;  // worker id = transport rank
  int32_t seq = 0;
  int64_t bytes = 0;
  bool zero_copy = false;
  int32_t step = 0;  // Bucket.step
  int64_t staging_offset = 0;
  void* direct = nullptr;
};

struct BoundRound {
  int32_t index = 0;
  int64_t plan_staging_bytes = 0;    // Round.staging_bytes
  int64_t staging_bytes = 0;         // used by this binding (<= plan_staging_bytes)
  std::vector<BoundTransfer> sends;  // in (peer, seq) order
  std::vector<BoundTransfer> recvs;  // in (peer, seq) order
  std::vector<PackItem> pack;
  std::vector<UnpackItem> unpack;
  std::vector<CopyItem> copies;
  std::vector<ReduceInput> reduce_inputs;
  std::vector<ReduceItem> reduces;
  std::vector<int64_t> copy_buckets;  // for messages
  // Per copy_buckets entry: its items in `copies` (in order), and whether
  // any of its pieces is quantized or reduced instead (verify_pass.h).
  std::vector<int32_t> copy_counts;
  std::vector<bool> copy_transformed;
  std::vector<int64_t> reduce_ids;  // for messages
  // Block fp8: receiver-side Quantize ops and quantizing local copies, run
  // after the round's reduces.
  std::vector<QuantizeInput> quantize_inputs;
  std::vector<QuantizeItem> quantizes;
  std::vector<int64_t> quantize_ids;  // for messages (local copies: -bucket - 1)
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t bytes_local = 0;  // wire bytes of local (COPY) buckets
};

// Direct writes of one sync: what the buckets its plan part routes
// ROUTE_PEER_WRITE need (the controller decides the routes,
// controller/plan/routes.h). Such a bucket this worker sends becomes puts
// into the receiver's destination buffers, mapped into this process in
// `peer_buffers`; one it receives arrives without any op of its own.
struct DirectWrites {
  std::map<int32_t, const BufferRegistry*> peer_buffers;  // not owned
  // What this worker's ready tokens carry (a fingerprint of its registered
  // buffers) and what each write_to peer's must carry (the fingerprint of
  // the buffers mapped for it): a receiver whose owner re-registered after
  // the controller listed its buffers is not written (the writes would land
  // in memory it no longer reads).
  uint64_t ready_token = 0;
  std::map<int32_t, uint64_t> expected_ready_tokens;
};

// A ROUTE_PEER_WRITE bucket this worker sends (its sources) or receives
// (its destinations, written by the peer), as its checksum reads it
// (DataOps::QueueWireChecksum): the same wire bytes on both sides.
struct DirectBucket {
  int64_t bucket = 0;
  int32_t peer = 0;  // the receiver of a sent bucket, the sender of a received one
  int32_t round = 0;
  int32_t seq = 0;
  int64_t bytes = 0;
  bool sent = false;
  // Bucket.put_phase: a writer issues its puts phase by phase.
  int32_t put_phase = 0;
  // By bucket offset. A sender reads each piece's source converted to the
  // destination dtype and then to the wire dtype (what the receiver can
  // read back from what the put wrote: the put converts src -> dst once),
  // a receiver its destination converted to the wire dtype.
  std::vector<WireHashItem> items;
  // A sent bucket's puts: BoundPlan::puts[first_put, first_put + num_puts).
  int32_t first_put = 0;
  int32_t num_puts = 0;
};

// A process-unique number that every copy renews: a copied plan may be
// changed, so it never shares a prepared list (ItemsHandle) with its original.
class PlanInstance {
 public:
  PlanInstance() : value_(Next()) {}
  PlanInstance(const PlanInstance&) : value_(Next()) {}
  PlanInstance& operator=(const PlanInstance&) {
    value_ = Next();
    return *this;
  }
  uint64_t value() const { return value_; }

 private:
  static uint64_t Next();
  uint64_t value_;
};

// Not changed once bound (BindPlan hands it out const): the executor and the
// data ops key what they derive from it by `instance`.
struct BoundPlan {
  PlanInstance instance;
  std::string key;
  int32_t worker = 0;
  uint64_t registry_generation = 0;
  MemorySpace space = MemorySpace::kHost;
  std::vector<BoundRound> rounds;  // increasing index
  int64_t max_staging_bytes = 0;
  int64_t total_bytes = 0;  // sent + received + local + put, over all rounds
  // Direct writes: every piece of every bucket it sends routed
  // ROUTE_PEER_WRITE, by put phase, then in round order; issued at once
  // after the ready tokens (they need no staging).
  std::vector<CopyItem> puts;
  // Where each put came from (worker, round, bucket, piece, tensor), for
  // errors the data ops report about one put item.
  std::vector<std::string> put_origins;
  // The peers of its ROUTE_PEER_WRITE buckets (sorted worker ids): it writes
  // the first, the second write it.
  std::vector<int32_t> direct_write_to;
  std::vector<int32_t> direct_written_by;
  uint64_t ready_token = 0;
  std::map<int32_t, uint64_t> expected_ready_tokens;
  // Every ROUTE_PEER_WRITE bucket it sends or receives, in round order
  // (bucket checksums of direct writes).
  std::vector<DirectBucket> direct_buckets;
  int64_t bytes_put = 0;       // wire bytes of the buckets written directly
  int64_t bytes_put_into = 0;  // wire bytes peers write into this worker
};

// Binds `worker`'s part of `plan` (a full plan or ExtractRankPlan's output).
// Errors name the worker, round, op, bucket, piece and buffer at fault.
// Views must live in `space` (the data ops' memory) and the transport ranks
// are the worker ids. Buckets go as the plan routes them: a ROUTE_PEER_WRITE
// bucket it sends becomes puts into the receiver's buffers in `direct` (may
// be null when the plan routes none; FAILED_PRECONDITION if the receiver's
// are not mapped), and one that cannot be written directly (a reduce or
// quantize input, a relay, block-fp8 packing) is refused.
absl::StatusOr<std::shared_ptr<const BoundPlan>> BindPlan(const v1::Plan& plan, int32_t worker,
                                                          const BufferRegistry& registry,
                                                          MemorySpace space,
                                                          const DirectWrites* direct = nullptr);

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_BOUND_PLAN_H_
