#include "controller/server/report_timings.h"

#include <algorithm>
#include <cmath>

namespace wsync::controller {
namespace {

// The duration between two worker-clock instants as seconds, clamped into
// [0, elapsed]; absl saturates out-of-range arithmetic to +-infinity.
double ClampedSpan(absl::Time from, absl::Time to, absl::Duration elapsed) {
  const double limit = absl::ToDoubleSeconds(elapsed);
  const double span = absl::ToDoubleSeconds(to - from);
  if (std::isnan(span)) return 0.0;
  return std::clamp(span, 0.0, std::max(0.0, limit));
}

}  // namespace

double SaneSeconds(double seconds, absl::Duration elapsed) {
  if (!std::isfinite(seconds) || seconds < 0) return 0.0;
  return std::min(seconds, std::max(0.0, absl::ToDoubleSeconds(elapsed)));
}

void RecordReportTimings(const v1::ReportResultRequest& req, absl::Time sync_start,
                         absl::Time pushed, absl::Time now, v1::SyncStatus& s) {
  const absl::Duration elapsed = now - sync_start;
  auto raise = [&](double current, double reported) {
    return std::max(current, SaneSeconds(reported, elapsed));
  };
  s.set_max_setup_seconds(raise(s.max_setup_seconds(), req.setup_seconds()));
  s.set_max_execute_seconds(raise(s.max_execute_seconds(), req.execute_seconds()));
  s.set_max_queue_seconds(raise(s.max_queue_seconds(), req.queued_seconds()));
  s.set_max_bind_seconds(raise(s.max_bind_seconds(), req.bind_seconds()));
  s.set_max_run_seconds(raise(s.max_run_seconds(), req.run_seconds()));
  if (req.received_unix_us() > 0) {
    const double deliver =
        ClampedSpan(pushed, absl::FromUnixMicros(req.received_unix_us()), elapsed);
    s.set_max_deliver_seconds(std::max(s.max_deliver_seconds(), deliver));
  }
  if (req.reported_unix_us() > 0) {
    const double report = ClampedSpan(absl::FromUnixMicros(req.reported_unix_us()), now, elapsed);
    s.set_max_report_seconds(std::max(s.max_report_seconds(), report));
  }
}

}  // namespace wsync::controller
