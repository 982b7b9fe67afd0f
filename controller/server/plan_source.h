// Plans for the controller: the planner's PlanCache (one BuildPlan per
// distinct bound spec, concurrent misses build once), plus whether each
// lookup hit, for metrics and SyncResponse.plan_cache_hit.
#ifndef WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_
#define WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/plan/plan_cache.h"
#include "controller/plan/routes.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::controller {

class PlanSource {
 public:
  struct Result {
    std::shared_ptr<const v1::Plan> plan;
    bool cache_hit = false;
    double seconds = 0;  // planning wall time (0 on a hit)
  };

  // At most `capacity` plans and `budget_bytes` of them (plan_cache.h; 0:
  // no byte budget); `build` carries the plan limits (--max_plan_buckets,
  // --max_plan_pieces).
  explicit PlanSource(size_t capacity = 64, int64_t budget_bytes = 0,
                      plan::BuildOptions build = plan::BuildOptions())
      : capacity_(capacity), cache_(capacity, budget_bytes, build) {}

  absl::StatusOr<Result> Get(const v1::TransferSpec& spec);

  // plan::PeerWriteEligiblePairs of `plan`, scanned once per plan key (a
  // plan of ~0.5 M pieces is not rescanned every sync). Never null.
  std::shared_ptr<const std::vector<plan::WorkerPair>> PeerWritePairs(const v1::Plan& plan);
  // How many plans were scanned for PeerWritePairs (tests, diagnostics).
  int64_t peer_write_scans() const;

  // A sync that reused the previous sync's plan without looking it up
  // (SyncCoordinator::Prepared) counts as a hit too.
  void CountReuse() { reused_.fetch_add(1); }
  int64_t reused() const { return reused_.load(); }
  int64_t hits() const { return cache_.hits() + reused(); }
  int64_t misses() const { return cache_.misses(); }
  int64_t cached_bytes() const { return cache_.bytes(); }
  size_t cached_plans() const { return cache_.size(); }

 private:
  const size_t capacity_;
  plan::PlanCache cache_;
  mutable absl::Mutex mu_;
  // Plan key -> its eligible pairs; as many entries as plans cached.
  absl::flat_hash_map<std::string, std::shared_ptr<const std::vector<plan::WorkerPair>>>
      peer_write_pairs_ ABSL_GUARDED_BY(mu_);
  int64_t peer_write_scans_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> reused_{0};
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_
