// Put phases: the order in which the writers of one sync issue their direct
// writes (docs/direct-writes.md, "Put phases").
//
// Copy engines that write several peers at once, or a receiver written by
// several writers at once, share NVSwitch ports badly: on 4 x H200 the
// colocated FSDP2 -> 2 x TP2 byte matrix moves at 64-77 % of its busiest
// port's rate when every pair is issued at once, and at 97-102 % when the
// writers take the pairs in matchings (bench/results/
// gpu-2026-11-28-session23.md). The phases here are such a sequence: a
// Birkhoff-von Neumann decomposition of the sync's peer-write byte matrix
// (padded to equal row and column sums), so that in each phase every worker
// writes at most one peer and is written by at most one, and the phases'
// byte maxima add up to the busiest worker's bytes in or out. Buckets get
// the phase their middle byte falls in; a pair's buckets keep their (round,
// seq) order. Writers that run ahead of a phase (a worker with less to move)
// start the next one early; no barrier separates the phases.
#ifndef WSYNC_CONTROLLER_PLAN_PUT_PHASES_H_
#define WSYNC_CONTROLLER_PLAN_PUT_PHASES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "controller/plan/routes.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

// The most workers one connected group of peer-write pairs may have for
// phases to be planned (up to n^2 phases, each a bottleneck matching found
// by a binary search over Kuhn's O(n^3) search: O(n^5 log n), ~9 M steps at
// 16); a larger group's buckets all stay in phase 0, issued as before.
inline constexpr int32_t kMaxPutPhaseWorkers = 16;

struct PutPhases {
  // Indexed by bucket id: the phase of every network bucket of `pairs`, 0
  // for any other bucket. Empty when there are no pairs.
  std::vector<int32_t> phase_of_bucket;
  // Phases planned, over all groups (a group's phases are numbered from 0).
  int32_t num_phases = 0;
};

// The phases of `plan`'s network buckets whose (sender, receiver) is in
// `pairs` (sorted, as ChoosePeerWrites returns them). Bucket ids must be
// dense from 0 (the planner's); a bucket whose id is out of range is left
// out. Deterministic: the same plan and pairs give the same phases.
PutPhases PlanPutPhases(const v1::Plan& plan, const std::vector<WorkerPair>& pairs);

// A name for the put phases of one worker part, the same in every process
// and run: "/ph<16 hex digits>" (FNV-1a over the (bucket id, phase) of its
// buckets in a phase other than 0), "" when all are in phase 0. A part whose
// phases did not change keeps its name, so it is not sent again.
std::string PutPhasesKey(const v1::Plan& part, const std::vector<int32_t>& phase_of_bucket);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PUT_PHASES_H_
