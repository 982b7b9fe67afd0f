// The /metrics HTTP endpoint shared by the controller and the worker.
#ifndef WSYNC_COMMON_METRICS_ENDPOINT_H_
#define WSYNC_COMMON_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "prometheus/exposer.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace wsync {

// Histogram boundaries for durations, from 1 ms to a minute.
prometheus::Histogram::BucketBoundaries DurationSecondsBuckets();

// Histogram boundaries for whole syncs and their phases, from 10 ms to two
// hours: the top finite bucket (7200 s) lies beyond the longest deadline a
// sync may ask for by default (--max_sync_deadline, 1 h), so a slow sync
// lands in a bucket, not in +Inf.
prometheus::Histogram::BucketBoundaries SyncSecondsBuckets();

// What this binary was built from (set at CMake configure time; see
// docs/flags-and-metrics.md "Metrics"): the project version, the git commit ("unknown"
// outside a git checkout unless -DWSYNC_GIT_COMMIT=... names it) and the
// CMake build type.
struct BuildInfo {
  std::string version;
  std::string git_commit;
  std::string build_type;
};
BuildInfo GetBuildInfo();

// Adds the gauge wsync_build_info{version,git_commit,build_type,component} = 1
// to `registry`; `component` is "controller" or "worker".
void RegisterBuildInfo(prometheus::Registry& registry, const std::string& component);

class MetricsEndpoint {
 public:
  // Serves `registry` on bind_address ("host:port"; port 0 picks a free one).
  absl::Status Serve(const std::string& bind_address,
                     const std::shared_ptr<prometheus::Registry>& registry);
  int port() const;  // 0 when not serving

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace wsync

#endif  // WSYNC_COMMON_METRICS_ENDPOINT_H_
