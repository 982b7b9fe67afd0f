// wsync-demo's placement and link-rate flags (tools/demo/placement.h).
#include "absl/flags/flag.h"
#include "common/status_macros.h"
#include "tools/demo/placement.h"

ABSL_FLAG(std::string, placement, "",
          "Comma-separated slot of each worker, in worker order (trainer ranks, then inference "
          "ranks unless --colocated): with --gpus the slot is the worker's GPU. Default "
          "0,1,2,... (tools/demo/placement.h).");
ABSL_FLAG(int32_t, slots_per_node, 0,
          "N > 0: the worker on slot s runs on node n<s/N> (wsync-worker --node) and the spec "
          "names that node: two or more nodes on one host (direct writes only inside a node). "
          "0: every worker on this host's node.");
ABSL_FLAG(double, nvlink_gbps, 0,
          "Link model given to the planner (spec options.link_model), GB/s within a node; 0: "
          "the planner's default.");
ABSL_FLAG(double, nic_gbps, 0, "As --nvlink_gbps, across nodes.");
ABSL_FLAG(double, copy_gbps, 0, "As --nvlink_gbps, local copies within a worker.");
ABSL_FLAG(std::string, spec_out, "",
          "Write the transfer spec the demo defines here (JSON, for `wsyncctl plan`).");

namespace wsync::demo {

absl::StatusOr<Placement> PlaceWorkersFromFlags(int num_workers, int gpus, v1::TransferSpec* spec) {
  ASSIGN_OR_RETURN(Placement placement,
                   ParsePlacement(absl::GetFlag(FLAGS_placement),
                                  absl::GetFlag(FLAGS_slots_per_node), num_workers, gpus));
  RETURN_IF_ERROR(ApplyNodes(placement, spec));
  RETURN_IF_ERROR(ApplyLinkRates(absl::GetFlag(FLAGS_nvlink_gbps), absl::GetFlag(FLAGS_nic_gbps),
                                 absl::GetFlag(FLAGS_copy_gbps), spec));
  if (!absl::GetFlag(FLAGS_spec_out).empty()) {
    RETURN_IF_ERROR(WriteSpecJson(*spec, absl::GetFlag(FLAGS_spec_out)));
  }
  return placement;
}

}  // namespace wsync::demo
