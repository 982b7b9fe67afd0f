// WorkerMetrics: build info, and a worker's part of a long sync lands in a
// finite bucket.
#include "worker/agent/worker_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/metric_family.h"

namespace wsync::agent {
namespace {

const prometheus::ClientMetric* Only(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name == name && f.metric.size() == 1) return &f.metric[0];
  }
  return nullptr;
}

TEST(WorkerMetricsTest, BuildInfoNamesTheWorker) {
  WorkerMetrics m;
  const auto families = m.registry().Collect();
  const prometheus::ClientMetric* c = Only(families, "wsync_build_info");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->gauge.value, 1);
  std::string component, version;
  for (const auto& l : c->label) {
    if (l.name == "component") component = l.value;
    if (l.name == "version") version = l.value;
  }
  EXPECT_EQ(component, "worker");
  EXPECT_EQ(version, GetBuildInfo().version);
}

TEST(WorkerMetricsTest, AnHourLongSyncLandsInAFiniteBucket) {
  WorkerMetrics m;
  m.Sync(3500);
  const auto families = m.registry().Collect();
  const prometheus::ClientMetric* c = Only(families, "wsync_worker_sync_duration_seconds");
  ASSERT_NE(c, nullptr);
  ASSERT_GE(c->histogram.bucket.size(), 2u);
  // The last finite bucket already counts it (+Inf is the last one).
  const auto& last_finite = c->histogram.bucket[c->histogram.bucket.size() - 2];
  EXPECT_GT(last_finite.upper_bound, 3600);
  EXPECT_EQ(last_finite.cumulative_count, 1u);
}

}  // namespace
}  // namespace wsync::agent
