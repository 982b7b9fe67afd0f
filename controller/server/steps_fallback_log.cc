#include "controller/server/steps_fallback_log.h"

#include "common/bucket_steps.h"
#include "common/logging.h"

namespace wsync::controller {

bool StepsFallbackLog::Note(const std::string& transfer, const WorkerSnapshot& worker,
                            int32_t worker_id) {
  {
    absl::MutexLock lock(&mu_);
    std::string& last = lease_of_[transfer];
    if (last == worker.lease_id) return false;
    last = worker.lease_id;
  }
  spdlog::warn(
      "[controller] transfer '{}': planned without steps inside rounds: {} [worker {}] did not "
      "register '{}' (an older build); upgrade it to use step_latency_seconds",
      transfer, worker.description, worker_id, kBucketStepsCapability);
  return true;
}

}  // namespace wsync::controller
