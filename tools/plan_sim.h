// `wsyncctl plan`'s simulator (controller/plan/simulator.h): the flags that
// feed it (--nvlink-gbps, --nic-gbps, --copy-gbps, --round-latency-us,
// --sim-rates-only, --nccl-net) and the lines it prints (the summary's
// "simulator" line, --sim-json's SIM line, --rounds). The text output
// prints them on stdout; --json keeps stdout for the plan and prints them on
// stderr, whenever one of those flags is given.
#ifndef WSYNC_TOOLS_PLAN_SIM_H_
#define WSYNC_TOOLS_PLAN_SIM_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/plan/routes.h"
#include "controller/plan/simulator.h"
#include "tools/args.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::tools {

// Seconds with a unit that keeps 3-4 significant digits.
std::string SecondsText(double s);

// The rate flags given (--nvlink-gbps, --nic-gbps, --copy-gbps,
// --round-latency-us) into options.link_model (plan::ApplyLinkRateFlags).
// INVALID_ARGUMENT naming the flag on a value that is no number or out of
// range.
absl::Status ApplyLinkFlags(const Args& args, v1::PlanOptions* options);

// Whether `args` give any flag that feeds or prints the simulator (the rate
// flags, --sim-rates-only, --nccl-net, --sim-json, --rounds).
bool HasSimulatorFlags(const Args& args);

struct PlanSimulation {
  plan::WorkerNodes nodes;  // of the planned spec
  bool nccl_net = false;    // --nccl-net
  // With --nccl-net: the same-node pairs the plan lets write directly, the
  // only ones simulated on NVLink.
  std::vector<plan::WorkerPair> nvlink_pairs;
  plan::SimulationResult result;
};

// Simulates `plan` (built from `spec`) at `sim_options`' link model (the
// spec's options with the rate flags applied), with --nccl-net as `args` say.
// Errors: the spec's nodes or the simulation's.
absl::StatusOr<PlanSimulation> SimulatePlanForArgs(const Args& args, const v1::TransferSpec& spec,
                                                   const v1::PlanOptions& sim_options,
                                                   const v1::Plan& plan);

// The summary's "  simulator ..." line (with its newline). With `nccl_net`
// (--nccl-net) the makespan is not compared with the routing bound, which
// assumes that two workers of one node move bytes over NVLink only.
std::string SimulatorLine(const v1::Plan& plan, const plan::SimulationResult& sim,
                          bool nccl_net = false);

// To `out`: the SIM line (--sim-json), then every round's simulated time
// (--rounds).
void PrintSimulationLines(const Args& args, const v1::Plan& plan, const PlanSimulation& sim,
                          FILE* out);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_PLAN_SIM_H_
