// Plan simulator: predicts how long a v1::Plan takes under a link model, and
// the lower bound that no schedule of the same traffic can beat.
//
// Model (one H100/H200-class GPU per worker):
//  * Each worker has, per direction, one NVLink port (nvlink_bytes_per_second,
//    used for peers on the same non-empty node name) and one NIC (nic_bytes_per_second, peers
//    on other nodes); the two run in parallel. Local buckets (sender ==
//    receiver) are HBM copies at local_copy_bytes_per_second.
//  * A round ends at a barrier. Worker w's time in step s of round r is
//      max(nvlink_out/nvlink, nic_out/nic, nvlink_in/nvlink, nic_in/nic, local/hbm)
//    over the bucket bytes it sends, receives and copies in that step
//    (Bucket.step; local copies count in step 0). A step takes the max over
//    workers; a round takes its steps with traffic one after the other, plus
//    step_latency_seconds for each but the first, plus round_latency_seconds;
//    makespan = sum of rounds. (Steps run without barriers, so this charges
//    a step's slowest worker to all: an upper estimate for plans whose steps
//    pipeline.)
//  * Reduces, packing and unpacking are not charged (they overlap transfers).
//
// Lower bound: for every worker and each of its five links (NVLink out/in,
// NIC out/in, HBM copy) the plan's total bytes on that link over all rounds
// divided by the link's bandwidth; the bound is the max over workers and
// links. Any schedule of the same per-worker traffic needs at least that
// long, whatever the rounds; makespan >= lower bound always holds, and
// makespan / bound measures what the round structure costs. It is a bound for
// the plan's routing choices (which source feeds which destination, relays),
// not over all possible routings.
#ifndef WSYNC_CONTROLLER_PLAN_SIMULATOR_H_
#define WSYNC_CONTROLLER_PLAN_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

// worker id -> node name.
using WorkerNodes = absl::flat_hash_map<int32_t, std::string>;

struct LinkBytes {
  int64_t nvlink_out = 0;
  int64_t nvlink_in = 0;
  int64_t nic_out = 0;
  int64_t nic_in = 0;
  int64_t local = 0;
};

struct LinkRates {
  double nvlink = 0;
  double nic = 0;
  double local = 0;
  double round_latency = 0;
  double step_latency = 0;
};

struct WorkerLoad {
  int32_t worker = 0;
  LinkBytes bytes;           // totals over all rounds
  double bound_seconds = 0;  // its busiest link's bytes / bandwidth
  double busy_seconds = 0;   // sum over rounds of its time in the round
};

struct RoundTiming {
  int32_t round = 0;
  double seconds = 0;            // including round and step latencies
  int32_t critical_worker = -1;  // of its longest step; -1 for a round without traffic
  int32_t steps = 0;             // steps with traffic
};

struct SimulationResult {
  double makespan_seconds = 0;
  double lower_bound_seconds = 0;
  int32_t bound_worker = -1;
  std::string bound_link;           // "nvlink_out", "nvlink_in", "nic_out", "nic_in", "local"
  std::vector<RoundTiming> rounds;  // one per plan round
  std::vector<WorkerLoad> workers;  // every worker with traffic, by worker id
};

// Zero or negative fields take the defaults: NVLink 370e9 B/s, NIC 50e9 B/s,
// HBM copy 2e12 B/s, round and step latency 0.
LinkRates EffectiveRates(const v1::LinkModel& model);

// Seconds a worker needs to move `bytes` over its links (the max over links).
double BusiestLinkSeconds(const LinkBytes& bytes, const LinkRates& rates,
                          std::string* busiest = nullptr);

struct SimulateOptions {
  // Null: bytes between two workers of one named node move over NVLink.
  // Set (sorted (sender, receiver) pairs): NCCL is forced onto its network
  // transport even inside a node (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, as
  // in bench/gpu/run_two_nodes.sh), so only these pairs -- the direct writes,
  // which bypass NCCL -- move at the NVLink rate, and only when both ends are
  // on one node; every other transfer between two workers takes the NIC.
  const std::vector<std::pair<int32_t, int32_t>>* nvlink_pairs = nullptr;
};

// Errors: a bucket whose sender or receiver has no node, a round outside
// [0, num_rounds), a step outside [0, kMaxBucketSteps) (0 for a local
// bucket), negative bytes, or a transport that contradicts sender/receiver
// (LOCAL with two workers, NETWORK with one).
absl::StatusOr<SimulationResult> SimulatePlan(const v1::Plan& plan, const WorkerNodes& nodes,
                                              const v1::LinkModel& model,
                                              const SimulateOptions& options = {});

// The node map of a spec (both sides). Error if one worker is given two nodes.
absl::StatusOr<WorkerNodes> WorkerNodesFromSpec(const v1::TransferSpec& spec);
// The node map a plan carries (plan.workers). Error on a repeated worker.
absl::StatusOr<WorkerNodes> WorkerNodesFromPlan(const v1::Plan& plan);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_SIMULATOR_H_
