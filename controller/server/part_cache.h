// SyncCoordinator's cache of worker parts: each worker's part of a plan,
// unrouted and routed (with put phases). Built outside the coordinator's lock; its own
// lock is a leaf (nothing is called while holding it). Bounded: a full map is
// cleared in bulk (plans leave the plan cache oldest first, and a part is
// rebuilt from its plan when asked again).
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

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Plan>> parts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_PART_CACHE_H_
