// The warning that a transfer was planned without steps inside rounds because
// one of its workers did not register kBucketStepsCapability
// (ClearStepsUnlessEveryWorkerRunsThem), given once per (transfer, worker
// lease): the check runs at every definition, plan request and registry
// change, and a fleet with an older worker would otherwise repeat it for each.
#ifndef WSYNC_CONTROLLER_SERVER_STEPS_FALLBACK_LOG_H_
#define WSYNC_CONTROLLER_SERVER_STEPS_FALLBACK_LOG_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "controller/server/worker_registry.h"

namespace wsync::controller {

class StepsFallbackLog {
 public:
  // Warns that `transfer` is planned without steps because of `worker`
  // (worker id `worker_id` in the transfer), unless the last warning for
  // `transfer` named the same lease. Returns whether it warned. Thread-safe.
  bool Note(const std::string& transfer, const WorkerSnapshot& worker, int32_t worker_id);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> lease_of_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_STEPS_FALLBACK_LOG_H_
