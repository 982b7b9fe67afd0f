// Where wsync-demo's workers run (--placement, --slots_per_node) and the
// link rates its spec gives the planner (--nvlink_gbps, --nic_gbps,
// --copy_gbps); --spec_out writes the spec it defines, for `wsyncctl plan`.
//
// Workers are numbered as the catalog numbers them in the spec: trainer rank
// r is worker r (with inference rank r when colocated), else inference rank r
// is worker num_trainer + r. Worker i runs on slot placement[i]: with --gpus
// the slot is its GPU (and its owner's). With --slots_per_node N > 0 it also
// runs on node "n<slot / N>" (wsync-worker --node), and the spec's ranks name
// that node, so the planner's topology, the simulator and the controller's
// direct writes (only inside a node) all see the same split: two or more
// "nodes" on one host.
#ifndef WSYNC_TOOLS_DEMO_PLACEMENT_H_
#define WSYNC_TOOLS_DEMO_PLACEMENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::demo {

struct Placement {
  std::vector<int> slots;          // by worker
  std::vector<std::string> nodes;  // by worker; all empty without --slots_per_node
};

// Parses `placement` ("" = 0,1,...,num_workers-1): exactly num_workers
// distinct slots >= 0, each < gpus when gpus > 0. slots_per_node >= 0.
// Errors name the flag and the offending entry.
absl::StatusOr<Placement> ParsePlacement(const std::string& placement, int slots_per_node,
                                         int num_workers, int gpus);

// Sets every rank's node in both sides of `spec` to placement.nodes[worker]
// (no-op when the nodes are empty). Error on a worker outside the placement.
absl::Status ApplyNodes(const Placement& placement, v1::TransferSpec* spec);

// Sets spec.options.link_model from GB/s (1e9 B/s) rates
// (plan::ApplyLinkRateFlags); a zero rate leaves the field as it is (the
// planner's default). Error on a negative rate or one above 1e12.
absl::Status ApplyLinkRates(double nvlink_gbps, double nic_gbps, double copy_gbps,
                            v1::TransferSpec* spec);

// Writes `spec` as proto3 JSON (what `wsyncctl plan SPEC.json` reads).
absl::Status WriteSpecJson(const v1::TransferSpec& spec, const std::string& path);

// wsync-demo's flags (tools/demo/placement_flags.cc, linked into wsync-demo
// only): --placement and --slots_per_node parsed for `num_workers` workers,
// the nodes and --nvlink_gbps / --nic_gbps / --copy_gbps applied to `spec`,
// which is then written to --spec_out when given.
absl::StatusOr<Placement> PlaceWorkersFromFlags(int num_workers, int gpus, v1::TransferSpec* spec);

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_PLACEMENT_H_
