// Limits of staged syncs shared by the controller and the workers
// (docs/staging.md, "Flags").
#ifndef WSYNC_COMMON_STAGING_LIMITS_H_
#define WSYNC_COMMON_STAGING_LIMITS_H_

#include <cstdint>

namespace wsync {

// The most a worker's --decision_slack may be (RegisterWorkerRequest
// .decision_slack_ms): one hour. A worker refuses a larger flag; the
// controller refuses a registration over it (INVALID_ARGUMENT) and clamps a
// saved value over it (a state file written by hand), so that a deadline
// plus the slack never overflows and a lost receiver is never awaited for
// longer than that.
inline constexpr int64_t kMaxDecisionSlackMs = int64_t{3600} * 1000;

}  // namespace wsync

#endif  // WSYNC_COMMON_STAGING_LIMITS_H_
