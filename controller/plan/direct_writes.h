// Which sender -> receiver pairs of a plan could write the receiver's
// destinations directly (mapped shm / CUDA IPC) instead of pack -> send ->
// unpack. A property of the plan only: whether the two workers can map each
// other's memory is decided per sync by the controller.
#ifndef WSYNC_CONTROLLER_PLAN_DIRECT_WRITES_H_
#define WSYNC_CONTROLLER_PLAN_DIRECT_WRITES_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

// (sender, receiver) worker ids.
using WorkerPair = std::pair<int32_t, int32_t>;

// True when the piece is a plain copy src -> dst: no partial sum (reduce_id),
// no receiver- or sender-side quantization (quantize_id, quant_block,
// scales_of), not a relay, and a wire dtype equal to src's or dst's (one
// conversion; the worker's binder refuses anything else).
bool IsPlainPiece(const v1::Piece& piece);

// The pairs, sorted, with sender != receiver and at least one
// TRANSPORT_NETWORK bucket sender -> receiver, such that
//  - every piece of every bucket sender -> receiver is plain, and
//  - the receiver sends no relay piece anywhere in the plan: a relay reads
//    the receiver's destinations, and a direct write fills them with no
//    ordering against the receiver's rounds.
// One pass over the buckets; meant to be computed once per plan and cached.
std::vector<WorkerPair> DirectWriteEligiblePairs(const v1::Plan& plan);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_DIRECT_WRITES_H_
