// Sizes of a plan known from its TransferSpec alone, before any side is
// compiled: what lets the planner refuse a plan over --max_plan_pieces in
// milliseconds instead of after compiling millions of fragments (Kimi-K2
// from FSDP2 over 256 ranks: 17.7 M source shards; compiling them alone took
// 3 GiB, and the cells after them exhausted a 24 GiB machine).
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_ESTIMATE_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_ESTIMATE_H_

#include <cstdint>

#include "wsync/v1/layout.pb.h"

namespace wsync::plan {

// A lower bound on the pieces of any plan of `spec` (Plan.summary.num_pieces):
// the sum, over the source regions the mappings read (a mapping entry's
// src_box; a destination tensor without an entry reads its same-named source
// tensor whole), of the distinct source shards each region meets.
//
// Why it bounds: a piece reads one source fragment and belongs to one
// mapping entry, and under DTensor placements distinct shards are disjoint,
// so every (region, shard) pair that shares a delivered element needs a
// piece of its own. A mesh destination holds every element; explicit
// destination fragments need not, so there a region counts the most shards
// that any one fragment's part of it meets. Shards are counted in closed form
// (no per-rank enumeration) for source mesh layouts whose placements are
// Replicate or at most one Shard per tensor dim; other source layouts
// (explicit fragments, Partial, StridedShard, nested shards) count one per
// non-empty region, and malformed entries count nothing (validation rejects
// them later with its own error). Saturates at INT64_MAX / 4. Time: the
// spec's size plus, per explicit destination tensor, fragments x regions
// (fragment-region pairs), at most kMinPiecesWorkBudget pairs per call in
// all: a tensor that would exceed what is left counts nothing (the spec is
// untrusted, and this runs before any other check).
inline constexpr int64_t kMinPiecesWorkBudget = int64_t{64} << 20;
int64_t MinPiecesFromSpec(const v1::TransferSpec& spec);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_ESTIMATE_H_
