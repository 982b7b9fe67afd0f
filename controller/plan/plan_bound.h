// The routing-independent bound of a transfer (docs/plan-format.md,
// "Routing-independent bound"): the least makespan any plan of the spec could
// reach under the link model, whatever it routes (which holder sends, which
// destinations relay, how data is chunked). It depends only on which workers
// hold each byte, which need it, their nodes and the link model; the planner
// computes it from its cells (stage 2's output, before any routing choice).
//
// With D2 the largest of the data terms below and D1 the largest of their
// one-round variants (no relays: only holders send), the bound is
//   min(latency + D1, latency + hop + D2)
// since a plan has at least one round, and a relay moves at least one hop
// behind the data it forwards: hop = the round latency, or, where the link
// model makes steps pay and some bytes could relay zero-copy
// (BoundHopLatency), the step latency (a relay in a later step of the same
// round).
// Data terms, per worker / holder set / node, each bytes over the most
// bandwidth that could carry them:
//  * ingress of worker w: the wire bytes it needs and holds no copy of, over
//    NIC + NVLink (NVLink only if w has node-mates, the NIC only if some
//    worker is on another node: the simulator's default model, where two
//    workers of one node move bytes over NVLink), and those no node-mate
//    holds or needs over its NIC alone;
//  * local copies of worker w: bytes it holds itself, over HBM;
//  * egress of a holder set H (the workers holding the same bytes): the bytes
//    some worker outside H needs leave H at least once, shared among H's links;
//  * a node's NICs: bytes its workers need that none of them holds come in,
//    bytes only its workers hold and another node needs go out, over
//    (workers of the node) x NIC.
// One round: holders send every needing worker its own copy (egress of H
// times the receivers), and a receiver's NVLink serves only bytes a
// node-mate holds.
// Partial (reduced) sources count in ingress only, at the narrower of the
// source and destination dtypes; a term left out only lowers the bound.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_BOUND_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_BOUND_H_

#include <string>

#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {

struct RoutingBound {
  double seconds = 0;            // min(latency + one_round, latency + hop + data)
  double data_seconds = 0;       // D2: the largest data term
  double one_round_seconds = 0;  // D1: the largest one-round data term
  std::string term;              // which term binds, e.g. "ingress of worker 17 (NIC)"
};

// From w->cells (after BuildCells), w->opt.link and the workers' nodes.
RoutingBound ComputeRoutingBound(const Work& w);

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_BOUND_H_
