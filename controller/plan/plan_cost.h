// Link-model cost of a plan: the lower bound (busiest link of the busiest
// worker: nvlink in/out, NIC in/out, local copies, each a separate resource)
// and the round-barrier prediction (each round lasts as long as its busiest
// worker link, plus the round latency). Shared by the planner, its tests and
// the simulator.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_COST_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_COST_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

enum class LinkClass : uint8_t { kLocal, kNvlink, kNic };

// Per-worker link resources; a transfer occupies the sender's *_OUT and the
// receiver's *_IN of its class; a local copy occupies kLocalCopy once.
enum LinkDir : int { kNvlOut = 0, kNvlIn, kNicOut, kNicIn, kLocalCopy, kNumLinkDirs };

double LinkSeconds(const v1::LinkModel& lm, LinkClass c, int64_t bytes);

// A pipeline of relays `depth` hops deep behind `seconds` of a busiest link,
// in rounds of c seconds each, ends its last hops `depth` rounds after the
// holders' last: about seconds + depth c + (seconds / c + depth) latency,
// least at depth + sqrt(depth x seconds / latency) rounds, returned at most
// kMaxPipelineRounds (0 without relays, latency or seconds). The planner's
// round search tries counts near it, and its bucket limit sizes buckets to
// its rounds.
constexpr int32_t kMaxPipelineRounds = 512;
double PipelineRoundCount(int32_t depth, double seconds, double latency);

// Whether rounds may become the steps of one round (Bucket.step,
// AssignSteps): a step costs less than a round barrier, and more than 0 (an
// unknown step latency makes no steps).
inline bool StepsPay(const v1::LinkModel& lm) {
  const double step = lm.step_latency_seconds();
  return step > 0 && step < lm.round_latency_seconds();
}

struct CostReport {
  double lower_bound_seconds = 0;
  double predicted_seconds = 0;
  std::vector<double> worker_busy_seconds;  // per dense worker: its busiest link
};

// Accumulates transfers per (round, worker, link) and evaluates both costs.
// The "rounds" it counts may be the slots of a plan with steps: then
// Report's `round_first_slot` (Work::round_first_slot) groups them, and a
// round costs the round latency, the maxima of its slots with a bucket and
// a step latency for each such slot after the first.
class CostModel {
 public:
  CostModel(const v1::LinkModel& lm, int32_t num_workers, int32_t num_rounds);
  void Add(int32_t round, int32_t sender, int32_t receiver, LinkClass c, int64_t bytes);
  CostReport Report(absl::Span<const int32_t> round_first_slot = {}) const;

 private:
  v1::LinkModel lm_;
  int32_t num_workers_;
  int32_t num_rounds_;
  std::vector<double> load_;   // [round][worker][dir]
  std::vector<double> total_;  // [worker][dir]
  std::vector<uint8_t> occupied_;  // [round]: some bucket was added
};

// Cost of a full plan, with links from plan.workers (same node = NVLink),
// steps included. Error when a bucket names a worker missing from
// plan.workers, or a round or step out of range.
absl::StatusOr<CostReport> EvaluatePlanCost(const v1::Plan& plan, const v1::LinkModel& lm);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_COST_H_
