#include "tools/plan_sim.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "controller/plan/link_rate_flags.h"
#include "controller/plan/planner.h"

namespace wsync::tools {
namespace {

// The pairs --nccl-net keeps on NVLink: those the plan lets write directly
// (plan::PeerWriteEligiblePairs) with both ends on one named node.
std::vector<plan::WorkerPair> SameNodeDirectPairs(const v1::Plan& plan,
                                                  const plan::WorkerNodes& nodes) {
  std::vector<plan::WorkerPair> out;
  for (const plan::WorkerPair& p : plan::PeerWriteEligiblePairs(plan)) {
    auto a = nodes.find(p.first), b = nodes.find(p.second);
    if (a != nodes.end() && b != nodes.end() && !a->second.empty() && a->second == b->second) {
      out.push_back(p);
    }
  }
  return out;
}

// "a->b,c->d" of sorted pairs.
std::string PairList(const std::vector<plan::WorkerPair>& pairs) {
  std::vector<std::string> out;
  for (const plan::WorkerPair& p : pairs) out.push_back(absl::StrCat(p.first, "->", p.second));
  return absl::StrJoin(out, ",");
}

// With --nccl-net: the same-node pairs with network buckets that direct
// writes cannot take (they cross NCCL's sockets inside a node).
std::vector<plan::WorkerPair> SameNodeTransportPairs(const v1::Plan& plan,
                                                     const plan::WorkerNodes& nodes,
                                                     const std::vector<plan::WorkerPair>& direct) {
  std::vector<plan::WorkerPair> out;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.transport() != v1::TRANSPORT_NETWORK || b.sender() == b.receiver()) continue;
    auto s = nodes.find(b.sender()), r = nodes.find(b.receiver());
    if (s == nodes.end() || r == nodes.end() || s->second.empty() || s->second != r->second) {
      continue;
    }
    const plan::WorkerPair p(b.sender(), b.receiver());
    if (!std::binary_search(direct.begin(), direct.end(), p)) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void PrintSimJson(const v1::Plan& plan, const PlanSimulation& sim, FILE* out) {
  const plan::SimulationResult& r = sim.result;
  const std::string nvlink_pairs = sim.nccl_net ? PairList(sim.nvlink_pairs) : "";
  const std::string transport_pairs =
      sim.nccl_net ? PairList(SameNodeTransportPairs(plan, sim.nodes, sim.nvlink_pairs)) : "";
  std::fprintf(
      out,
      "SIM {\"makespan_s\":%.9g,\"bound_s\":%.9g,\"bound_worker\":%d,\"bound_link\":\"%s\","
      "\"rounds\":%d,\"network_bytes\":%lld,\"local_bytes\":%lld,\"nccl_net\":%s,"
      "\"nvlink_pairs\":\"%s\",\"same_node_transport_pairs\":\"%s\"}\n",
      r.makespan_seconds, r.lower_bound_seconds, r.bound_worker, r.bound_link.c_str(),
      plan.num_rounds(), static_cast<long long>(plan.summary().network_bytes()),
      static_cast<long long>(plan.summary().local_bytes()), sim.nccl_net ? "true" : "false",
      nvlink_pairs.c_str(), transport_pairs.c_str());
}

}  // namespace

std::string SecondsText(double s) {
  if (s >= 1) return absl::StrFormat("%.3f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.3f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

absl::Status ApplyLinkFlags(const Args& args, v1::PlanOptions* options) {
  struct Flag {
    const char* name;
    plan::LinkField field;
  };
  const Flag known[] = {{"nvlink-gbps", plan::LinkField::kNvlink},
                        {"nic-gbps", plan::LinkField::kNic},
                        {"copy-gbps", plan::LinkField::kCopy},
                        {"round-latency-us", plan::LinkField::kRoundLatency},
                        {"step-latency-us", plan::LinkField::kStepLatency}};
  std::vector<plan::LinkRateFlag> given;
  for (const Flag& f : known) {
    if (!args.Has(f.name)) continue;
    double v = 0;
    if (!absl::SimpleAtod(args.Value(f.name), &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", f.name, " '", args.Value(f.name), "': want a number ",
          f.field == plan::LinkField::kRoundLatency || f.field == plan::LinkField::kStepLatency
              ? ">= 0"
              : "> 0",
          " up to 1e12"));
    }
    given.push_back({f.field, absl::StrCat("--", f.name), v});
  }
  return plan::ApplyLinkRateFlags(given, options);
}

bool HasSimulatorFlags(const Args& args) {
  for (const char* flag : {"nvlink-gbps", "nic-gbps", "copy-gbps", "round-latency-us",
                           "step-latency-us", "sim-rates-only", "nccl-net", "sim-json", "rounds"}) {
    if (args.Has(flag)) return true;
  }
  return false;
}

absl::StatusOr<PlanSimulation> SimulatePlanForArgs(const Args& args, const v1::TransferSpec& spec,
                                                   const v1::PlanOptions& sim_options,
                                                   const v1::Plan& plan) {
  PlanSimulation sim;
  ASSIGN_OR_RETURN(sim.nodes, plan::WorkerNodesFromSpec(spec));
  plan::SimulateOptions options;
  if (args.Has("nccl-net")) {
    sim.nccl_net = true;
    sim.nvlink_pairs = SameNodeDirectPairs(plan, sim.nodes);
    options.nvlink_pairs = &sim.nvlink_pairs;
  }
  ASSIGN_OR_RETURN(sim.result, plan::SimulatePlan(plan, sim.nodes,
                                                  plan::EffectiveLinkModel(sim_options), options));
  return sim;
}

std::string SimulatorLine(const v1::Plan& plan, const plan::SimulationResult& sim, bool nccl_net) {
  const v1::PlanSummary& s = plan.summary();
  const std::string routing =
      nccl_net ? "no routing bound under --nccl-net (it assumes NVLink within a node)"
               : absl::StrFormat("%.3f x the routing bound",
                                 s.routing_bound_seconds() > 0
                                     ? sim.makespan_seconds / s.routing_bound_seconds()
                                     : 0.0);
  return absl::StrFormat(
      "  simulator        makespan %s, bound %s (worker %d %s), %.3f x the plan's bound, %s\n",
      SecondsText(sim.makespan_seconds), SecondsText(sim.lower_bound_seconds), sim.bound_worker,
      sim.bound_link,
      sim.lower_bound_seconds > 0 ? sim.makespan_seconds / sim.lower_bound_seconds : 0.0, routing);
}

void PrintSimulationLines(const Args& args, const v1::Plan& plan, const PlanSimulation& sim,
                          FILE* out) {
  if (args.Has("sim-json")) PrintSimJson(plan, sim, out);
  if (!args.Has("rounds")) return;
  std::fprintf(out, "  rounds (simulated, including round and step latencies):\n");
  for (const plan::RoundTiming& r : sim.result.rounds) {
    std::fprintf(out, "    round %4d  %10s  critical worker %d", r.round,
                 SecondsText(r.seconds).c_str(), r.critical_worker);
    if (r.steps > 1) std::fprintf(out, "  (%d steps)", r.steps);
    std::fprintf(out, "\n");
  }
}

}  // namespace wsync::tools
