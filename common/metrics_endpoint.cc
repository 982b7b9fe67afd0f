#include "common/metrics_endpoint.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace wsync {

prometheus::Histogram::BucketBoundaries DurationSecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

absl::Status MetricsEndpoint::Serve(const std::string& bind_address,
                                    const std::shared_ptr<prometheus::Registry>& registry) {
  // prometheus-cpp reports bind failures only by throwing; turn that into a
  // Status at this one boundary.
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(bind_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", bind_address, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry);
  return absl::OkStatus();
}

int MetricsEndpoint::port() const {
  if (!exposer_) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

}  // namespace wsync
