// Phase gates (docs/direct-writes.md, "Phase gates"): the controller puts
// each peer-write bucket into a phase (Bucket.put_phase) so that, phase by
// phase, every worker of a group writes to at most one peer and is written
// by at most one. A writer that issued all its puts at once lets a fast
// writer run into its next phase while a slow one still writes the same
// receiver, and the two share that receiver's link. Gates keep the phases
// apart: before its puts of phase q > 0, a writer's put stream waits until
// each of its direct-write peers (whom it writes or who write it) has
// finished its puts of every phase below q, and after each phase it tells
// them so (PeerWriter::GatePuts / SignalAfterPuts, through the mailbox slot
// kPhase of executor_internal.h). Only direct peers line up: writers that
// share receivers but do not write each other (a fan-out's trainers) are
// not held to one phase, since their receivers post kAllPhases.
//
// The value a worker posts to a peer is (the pair's mailbox sequence << 16)
// | the first phase it has not finished (kAllPhases once it has none left),
// so it only grows across a sync and across syncs, and a value from an
// earlier sync never opens a later gate. A worker without gates this sync
// (a receiver only, checksums' part-wise puts, gates off) posts kAllPhases
// at once, so no peer waits for it. Gates never decide correctness: puts
// are correct in any order, and a gate whose peers stay silent (a dead or
// stalled peer) opens by its timeout; the done tokens still decide the sync.
#ifndef WSYNC_WORKER_EXEC_PHASE_GATES_H_
#define WSYNC_WORKER_EXEC_PHASE_GATES_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/exec/bound_plan.h"
#include "worker/plane/peer_writer.h"

namespace wsync::exec {

class PhaseGates {
 public:
  static constexpr uint32_t kAllPhases = 0xFFFF;
  static constexpr int kPhaseBits = 16;
  // The value posted for the pair's mailbox sequence `seq` once every phase
  // below `phase` is finished.
  static uint64_t Value(uint64_t seq, uint32_t phase) {
    return (seq << kPhaseBits) | (phase & kAllPhases);
  }

  // Each phase's range of plan.puts, which OrderPutsByPhase put in phase
  // order, with a prepared list per range (`writer` may be null: none).
  // The plan gets no gates (num_ranges() 0) when a sent bucket's puts fall
  // outside plan.puts, a phase is negative or >= kAllPhases, or the phases'
  // puts are not one contiguous range each in ascending phase order.
  void Prepare(const BoundPlan& plan, PeerWriter* writer);
  size_t num_ranges() const { return ranges_.size(); }

  // Issues plan.puts range by range on `writer` (Put(..., alone)): before
  // a range of phase q > 0 a gate on every peer in `peers` (its kPhase slot
  // >= Value(seq[peer], q)), after each range a signal to every peer of the
  // next phase this worker has puts in (kAllPhases after the last); a
  // first phase q0 > 0 is signalled before anything. `gates`: how many
  // gates were issued. A put error's item index (ErrorItemIndex) is the
  // failing item's in plan.puts. INTERNAL for puts without ranges (the
  // caller issues those without gates); with no puts, PostAllPhases.
  absl::Status Issue(const BoundPlan& plan, PeerWriter& writer,
                     const std::map<int32_t, uint64_t>& seq, absl::Span<const int32_t> peers,
                     bool alone, absl::Duration timeout, int32_t* gates) const;
  // Posts kAllPhases to every peer in `peers`: this worker gates nothing in
  // this sync.
  static absl::Status PostAllPhases(PeerWriter& writer, int32_t me,
                                    const std::map<int32_t, uint64_t>& seq,
                                    absl::Span<const int32_t> peers);

 private:
  struct Range {
    uint32_t phase = 0;
    size_t first = 0;
    size_t count = 0;
    ItemsHandle handle;
  };
  static std::vector<PeerWriter::GatePost> Posts(int32_t me, const std::map<int32_t, uint64_t>& seq,
                                                 absl::Span<const int32_t> peers, uint32_t phase);
  std::vector<Range> ranges_;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_PHASE_GATES_H_
