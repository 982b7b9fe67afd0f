// Names of the serving states an owner reports (worker_local.proto
// ServingState): the state label of the worker's and the controller's
// serving metrics, and what wsyncctl prints.
#ifndef WSYNC_COMMON_SERVING_STATE_H_
#define WSYNC_COMMON_SERVING_STATE_H_

#include "wsync/v1/worker_local.pb.h"

namespace wsync {

// "serving", "paused", "updating", "failed"; "unknown" for anything else.
const char* ServingStateName(v1::ServingState s);

// The four names above, in that order (one gauge per state).
inline constexpr const char* kServingStateNames[] = {"serving", "paused", "updating", "failed"};

}  // namespace wsync

#endif  // WSYNC_COMMON_SERVING_STATE_H_
