// The times a worker reports about its own run (ReportResultRequest 10-17)
// come from an untrusted process on an unsynchronized clock: NaN, negative,
// huge or future values must not reach SyncStatus (24-28 and the setup /
// execute maxima), where trainers and dashboards read them.
#ifndef WSYNC_CONTROLLER_SERVER_REPORT_TIMINGS_H_
#define WSYNC_CONTROLLER_SERVER_REPORT_TIMINGS_H_

#include "absl/time/time.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// One reported duration, made sane: non-finite or negative -> ignored
// (returns 0, which never raises a maximum); longer than `elapsed` (the
// sync's own age when the report arrived) -> `elapsed`.
double SaneSeconds(double seconds, absl::Duration elapsed);

// Folds one worker's report into the maxima of `status`. `sync_start`: when
// the sync started; `pushed`: when this worker's assignment was queued;
// `now`: when the report arrived. Durations derived from the worker's
// timestamps (delivery: received - pushed; report: now - reported) are
// clamped to [0, now - sync_start] (clock skew reads as 0); a timestamp <= 0
// (not sent) is ignored. Every field of `status` it writes stays finite and
// within [0, now - sync_start].
void RecordReportTimings(const v1::ReportResultRequest& req, absl::Time sync_start,
                         absl::Time pushed, absl::Time now, v1::SyncStatus& status);

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_REPORT_TIMINGS_H_
