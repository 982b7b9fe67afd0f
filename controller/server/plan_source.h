// Plans for the controller: one BuildPlan per distinct spec (keyed by the
// planner's PlanKey), shared by every later sync. Unchanged layouts are never
// re-planned; hits and misses are counted.
#ifndef WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_
#define WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

  explicit PlanSource(size_t capacity = 64) : capacity_(capacity) {}

  // Concurrent callers for the same new key may both plan; the first result
  // stays. Planning runs without holding the cache lock.
  absl::StatusOr<Result> Get(const v1::TransferSpec& spec);

  int64_t hits() const;
  int64_t misses() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Plan>> plans_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // insertion order, for eviction
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_PLAN_SOURCE_H_
