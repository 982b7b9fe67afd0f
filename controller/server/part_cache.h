// SyncCoordinator's cache of worker parts: each worker's part of a plan,
// unrouted and routed (with put phases), and the put phases of a plan under
// one set of peer-write pairs. Built outside the coordinator's lock; its own
// lock is a leaf (nothing is called while holding it). Bounded: a full map is
// cleared in bulk (plans leave the plan cache oldest first, and a part or a
// phase set is rebuilt from its plan when asked again).
#ifndef WSYNC_CONTROLLER_SERVER_PART_CACHE_H_
#define WSYNC_CONTROLLER_SERVER_PART_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "controller/plan/routes.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::controller {

class PartCache {
 public:
  // The most parts kept ("<plan key>/<worker>" unrouted, and
  // "<plan key>/<worker>/<routes><phases>" routed).
  static constexpr size_t kMaxParts = 4096;

  // Worker `worker`'s part of `plan` (a plan without work for it: an empty
  // part naming it, as every worker confirms every sync). The first call for
  // a plan splits it for all its workers in one pass.
  absl::StatusOr<std::shared_ptr<const v1::Plan>> WorkerPart(const v1::Plan& plan, int32_t worker);

  // `part` (worker's part of `plan`) routed, with put phases `phases` (by
  // bucket id), cached by *part_key: "<plan key>/<worker>", plus
  // "/<routes' signature><phases_key>" when `routes` is not empty (then the
  // routed part, else `part` itself).
  std::shared_ptr<const v1::Plan> RoutedPart(const v1::Plan& plan, int32_t worker,
                                             const std::shared_ptr<const v1::Plan>& part,
                                             const plan::WorkerRoutes& routes,
                                             const std::string& phases_key,
                                             absl::Span<const int32_t> phases,
                                             std::string* part_key);

  // The put phases of a plan under one set of peer-write pairs
  // (controller/plan/put_phases.h).
  struct Phases {
    std::vector<int32_t> phase_of_bucket;  // by bucket id
    // Worker id -> plan::PutPhasesKey of its part ("" for a worker in no pair).
    std::vector<std::string> part_keys;
  };
  // The most phase sets kept (one per plan and pair set).
  static constexpr size_t kMaxPhaseSets = 64;
  // The phases of `plan` (whose worker parts are `parts`, by worker id)
  // under `pairs` (sorted, as plan::ChoosePeerWrites returns them), planned
  // once per (plan key, pairs): a sync with the plan and the pairs of an
  // earlier one reuses them, a changed pair set plans anew. Never null.
  std::shared_ptr<const Phases> PutPhases(const v1::Plan& plan,
                                          absl::Span<const std::shared_ptr<const v1::Plan>> parts,
                                          const std::vector<plan::WorkerPair>& pairs);
  // How many times phases were planned (tests, diagnostics).
  int64_t put_phase_plans() const;

 private:
  using PhasesKey = std::pair<std::string, std::vector<plan::WorkerPair>>;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Plan>> parts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PhasesKey, std::shared_ptr<const Phases>> phases_ ABSL_GUARDED_BY(mu_);
  int64_t put_phase_plans_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_PART_CACHE_H_
