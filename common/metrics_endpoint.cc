#include "common/metrics_endpoint.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/gauge.h"

#ifndef WSYNC_VERSION
#error "WSYNC_VERSION is set by common/CMakeLists.txt"
#endif

namespace wsync {

prometheus::Histogram::BucketBoundaries DurationSecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

prometheus::Histogram::BucketBoundaries SyncSecondsBuckets() {
  return {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,    2.5,  5,    10,   20,
          30,   60,    120,  300, 600,  1200, 1800, 2700, 3600, 5400, 7200};
}

BuildInfo GetBuildInfo() { return BuildInfo{WSYNC_VERSION, WSYNC_GIT_COMMIT, WSYNC_BUILD_TYPE}; }

void RegisterBuildInfo(prometheus::Registry& registry, const std::string& component) {
  const BuildInfo info = GetBuildInfo();
  prometheus::BuildGauge()
      .Name("wsync_build_info")
      .Help("1, labelled with what this binary was built from and which component it is.")
      .Register(registry)
      .Add({{"version", info.version},
            {"git_commit", info.git_commit},
            {"build_type", info.build_type},
            {"component", component}})
      .Set(1);
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
