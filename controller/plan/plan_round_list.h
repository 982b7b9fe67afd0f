// Stage 8's list scheduler (plan_rounds.cc tries it beside its greedy fits):
// rounds filled one after the other, in time order. Internal to the planner.
//
// The greedy fits place units in relay generations, parents first, each in
// whichever round suits it; where trainers' sends and the relays behind them
// load the same links (FSDP shards fanned out to many replicas), children
// pile up in the last rounds. Filled in time order, a relay tends to follow
// the data it forwards by one round, so sends and relays overlap.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_ROUND_LIST_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_ROUND_LIST_H_

#include <cstdint>
#include <vector>

#include "controller/plan/plan_units.h"

namespace wsync::plan::planner_detail {

// A unit is ready once every parent sits in an earlier round. Round r takes
// ready units in priority order -- the longest relay chain below first, then
// the lower pair ordinal (so that each round spreads over every sender and
// receiver pair instead of draining one pair), then the heavier, then the
// lower id -- while each of the unit's links stays within `round_seconds`
// (a link with nothing on it yet takes any unit) and each worker's staged
// bytes within `staging_cap`; what does not fit waits for the next round.
// Returns each unit's round. Parents always come in earlier rounds than
// their children, and every round holds at least one unit (the first ready
// one goes in any case). Preconditions (BuildRoundUnits' units meet them):
// each unit has one load entry per (worker, direction) and one staging
// entry per worker, every staging entry <= staging_cap, every load finite
// and >= 0; the relay graph is acyclic.
std::vector<int32_t> ListScheduleRounds(const RoundUnits& units, int32_t num_workers,
                                        int64_t staging_cap, double round_seconds);

// The largest total over all units of one (worker, link direction), in
// seconds: no assignment of the units to rounds takes less, latencies aside.
double BusiestLinkTotal(const RoundUnits& units, int32_t num_workers);

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_ROUND_LIST_H_
