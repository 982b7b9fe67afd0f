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
