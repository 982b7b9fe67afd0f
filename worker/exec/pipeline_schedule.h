// Which parts of a bound plan's rounds the executor may run out of their
// plain order (pack, transfer, unpack, copy, reduce), decided once per bound
// plan from the memory the items touch:
//  * a round's local work (COPYs and REDUCEs with only unstaged inputs) may
//    be issued during its transfer when it neither reads nor writes memory
//    the transfer or the unpack writes, nor writes memory a zero-copy send
//    reads;
//  * round i+1 may be packed (into the other staging set) while round i
//    transfers when no pack item of i+1 reads memory that round i writes
//    after its transfer started (receives, unpack, reduces, deferred local
//    work). This is what keeps relays right: a piece re-sent in round i+1
//    reads what round i received, so that round is packed after round i.
//  * round i's work after its transfer (unpack, late COPYs, staged REDUCEs)
//    is issued during round i+1's transfer ("finish_async") when round
//    i+1's pack and zero-copy sends read nothing that work writes and its
//    zero-copy receives write nothing that work reads or writes. Staging needs no
//    check: round i+1 transfers through the other set, round i's unpack is
//    issued before round i+2's pack into that set (the data ops run in call
//    order), and round i+2, if it transfers, waits for every call issued so
//    far before its transfer starts.
// Overlap is judged on each view's address extent [first byte, last byte],
// which can only over-report conflicts, never miss one.
#ifndef WSYNC_WORKER_EXEC_PIPELINE_SCHEDULE_H_
#define WSYNC_WORKER_EXEC_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/exec/bound_plan.h"
#include "worker/plane/data_ops.h"

namespace wsync::exec {

struct RoundSchedule {
  int64_t staging_offset = 0;              // of this round's staging set (256-aligned)
  bool local_early = false;                // issue local_reduces and the copies during the transfer
  bool pack_ahead = false;                 // may be packed during the previous round's transfer
  bool finish_async = false;               // post-transfer work is issued during the next transfer
  std::vector<ReduceItem> local_reduces;   // every input unstaged
  std::vector<ReduceItem> staged_reduces;  // at least one input from staging
};

struct PipelineSchedule {
  std::vector<RoundSchedule> rounds;  // parallel to BoundPlan::rounds
  // One allocation of staging_bytes, used from both ends: rounds at even
  // positions start at offset 0, odd ones end at staging_bytes (each start
  // 256-aligned). Two neighbouring rounds may be live at once (pack ahead,
  // finish async) only where both fit side by side; without a limit both
  // always do (staging_bytes <= 2 * plan.max_staging_bytes + 510).
  int64_t staging_bytes = 0;
};

// `staging_limit` > 0 bounds staging_bytes: neighbouring rounds that do not
// fit together under it run one after the other. INVALID_ARGUMENT when one
// round alone needs more.
absl::StatusOr<PipelineSchedule> BuildPipelineSchedule(const BoundPlan& plan,
                                                       int64_t staging_limit = 0);

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_PIPELINE_SCHEDULE_H_
