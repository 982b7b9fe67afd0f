// Plans are computed once per (source, destination, mappings, options) and
// replayed every weight version: a thread-safe cache keyed by PlanKey,
// bounded by a count and by the bytes its plans occupy (each plan's arena:
// the memory it took from the allocator, google::protobuf::Arena::SpaceAllocated).
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_CACHE_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_CACHE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/plan/planner.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

class PlanCache {
 public:
  // Keeps at most `capacity` plans and, beyond the newest plan, at most
  // `budget_bytes` of plans (0: no byte budget); the oldest inserted goes
  // first. A plan over the whole budget is kept alone (the transfer that asked
  // for it would otherwise plan every sync). `build` applies to every plan
  // (its limits: planner.h).
  explicit PlanCache(size_t capacity = 16, int64_t budget_bytes = 0,
                     BuildOptions build = BuildOptions())
      : capacity_(capacity == 0 ? 1 : capacity), budget_bytes_(budget_bytes), build_(build) {}

  // The cached plan for `spec`, building it on a miss. Concurrent misses on
  // one key build once: later callers wait for the first. Errors are not
  // cached.
  absl::StatusOr<std::shared_ptr<const v1::Plan>> GetOrBuild(const v1::TransferSpec& spec);

  // nullptr when absent.
  std::shared_ptr<const v1::Plan> Lookup(const std::string& key) const;

  int64_t hits() const;
  int64_t misses() const;
  size_t size() const;
  // Bytes the cached plans occupy (their arenas).
  int64_t bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const v1::Plan> plan;
    int64_t bytes = 0;
    bool building = false;
  };

  const size_t capacity_;
  const int64_t budget_bytes_;
  const BuildOptions build_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_CACHE_H_
