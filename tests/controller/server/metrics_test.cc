// ControllerMetrics: the bounded `transfer` label, in-flight and deadline
// gauges, per-phase histograms, last success, lease churn, build info and
// buckets that reach past the longest sync deadline.
#include "controller/server/metrics.h"

#include <map>
#include <string>

#include "absl/time/clock.h"
#include "controller/server/config.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"

namespace wsync::controller {
namespace {

using Labels = std::map<std::string, std::string>;

double UnixSeconds(absl::Time t) { return static_cast<double>(absl::ToUnixMicros(t)) / 1e6; }

// The series `name` whose labels include `labels`; nullptr when absent.
const prometheus::ClientMetric* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name, const Labels& labels) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      size_t matched = 0;
      for (const prometheus::ClientMetric::Label& l : c.label) {
        auto it = labels.find(l.name);
        if (it != labels.end() && it->second == l.value) ++matched;
      }
      if (matched == labels.size()) return &c;
    }
  }
  return nullptr;
}

class MetricsTest : public ::testing::Test {
 protected:
  // Gauge or counter value; -1 when the series is absent.
  double Value(const std::string& name, const Labels& labels) {
    const auto families = metrics_.registry().Collect();
    const prometheus::ClientMetric* c = Find(families, name, labels);
    if (c == nullptr) return -1;
    return c->counter.value + c->gauge.value;
  }
  // A histogram's count of observations <= `le` (cumulative); -1 if absent.
  double BucketCount(const std::string& name, const Labels& labels, double le) {
    const auto families = metrics_.registry().Collect();
    const prometheus::ClientMetric* c = Find(families, name, labels);
    if (c == nullptr) return -1;
    for (const auto& b : c->histogram.bucket) {
      if (b.upper_bound >= le) return static_cast<double>(b.cumulative_count);
    }
    return -1;
  }
  double Count(const std::string& name, const Labels& labels) {
    const auto families = metrics_.registry().Collect();
    const prometheus::ClientMetric* c = Find(families, name, labels);
    return c == nullptr ? -1 : static_cast<double>(c->histogram.sample_count);
  }

  static v1::SyncStatus Status(const std::string& id, const std::string& transfer, double seconds) {
    v1::SyncStatus s;
    s.set_sync_id(id);
    s.set_transfer(transfer);
    s.set_elapsed_seconds(seconds);
    s.set_bytes_total(1000);
    s.set_plan_seconds(0.002);
    s.set_dispatch_seconds(0.003);
    s.set_max_deliver_seconds(0.004);
    s.set_max_queue_seconds(0.005);
    s.set_max_bind_seconds(0.2);
    s.set_max_run_seconds(seconds * 0.9);
    s.set_max_report_seconds(0.006);
    return s;
  }

  ControllerMetrics metrics_{2};  // two transfer labels, then "_other"
};

TEST_F(MetricsTest, SyncBucketsReachPastTheLongestDeadline) {
  const double longest = absl::ToDoubleSeconds(ControllerLimits{}.max_sync_deadline);
  EXPECT_GT(SyncSecondsBuckets().back(), longest);
  // A sync that used most of a one-hour deadline lands in a finite bucket.
  metrics_.SyncFinished("succeeded", Status("a@1#1", "a", 0.9 * longest));
  EXPECT_EQ(BucketCount("wsync_sync_duration_seconds", {{"transfer", "a"}}, longest), 1);
  EXPECT_EQ(BucketCount("wsync_sync_phase_seconds", {{"transfer", "a"}, {"phase", "run"}}, longest),
            1);
}

TEST_F(MetricsTest, TransferLabelsAreCappedAndStable) {
  EXPECT_EQ(metrics_.TransferLabel("a"), "a");
  EXPECT_EQ(metrics_.TransferLabel("b"), "b");
  EXPECT_EQ(metrics_.TransferLabel("c"), ControllerMetrics::kOverflowTransfer);
  EXPECT_EQ(metrics_.TransferLabel("d"), ControllerMetrics::kOverflowTransfer);
  EXPECT_EQ(metrics_.TransferLabel("a"), "a");
  metrics_.SyncFinished("failed", Status("c@1#1", "c", 1));
  metrics_.SyncFinished("failed", Status("d@1#2", "d", 1));
  EXPECT_EQ(Value("wsync_syncs_total", {{"transfer", "_other"}, {"outcome", "failed"}}), 2);
  EXPECT_EQ(Value("wsync_syncs_total", {{"transfer", "c"}, {"outcome", "failed"}}), -1);
  // A known transfer starts with zero series for every outcome.
  EXPECT_EQ(Value("wsync_syncs_total", {{"transfer", "b"}, {"outcome", "succeeded"}}), 0);
  metrics_.SetWeightVersion("d", 7);
  EXPECT_EQ(Value("wsync_weight_version", {{"transfer", "_other"}}), 7);
}

TEST_F(MetricsTest, InFlightAndDeadlineFollowStartedSyncs) {
  const absl::Time now = absl::Now();
  metrics_.SyncStarted("a@1#1", "a", now + absl::Seconds(120));
  EXPECT_EQ(Value("wsync_syncs_in_flight", {{"transfer", "a"}}), 1);
  EXPECT_DOUBLE_EQ(Value("wsync_sync_deadline_timestamp_seconds", {{"transfer", "a"}}),
                   UnixSeconds(now + absl::Seconds(120)));
  // Two overflow transfers in flight: both counted, the earliest deadline.
  metrics_.TransferLabel("b");
  metrics_.SyncStarted("c@1#2", "c", now + absl::Seconds(50));
  metrics_.SyncStarted("d@1#3", "d", now + absl::Seconds(30));
  EXPECT_EQ(Value("wsync_syncs_in_flight", {{"transfer", "_other"}}), 2);
  EXPECT_DOUBLE_EQ(Value("wsync_sync_deadline_timestamp_seconds", {{"transfer", "_other"}}),
                   UnixSeconds(now + absl::Seconds(30)));
  metrics_.SyncFinished("cancelled", Status("d@1#3", "d", 1));
  EXPECT_EQ(Value("wsync_syncs_in_flight", {{"transfer", "_other"}}), 1);
  EXPECT_DOUBLE_EQ(Value("wsync_sync_deadline_timestamp_seconds", {{"transfer", "_other"}}),
                   UnixSeconds(now + absl::Seconds(50)));
  metrics_.SyncFinished("succeeded", Status("a@1#1", "a", 1));
  EXPECT_EQ(Value("wsync_syncs_in_flight", {{"transfer", "a"}}), 0);
  EXPECT_EQ(Value("wsync_sync_deadline_timestamp_seconds", {{"transfer", "a"}}), 0);
  // A sync restored from the saved state was never started here.
  metrics_.SyncFinished("failed", Status("b@9#1", "b", 1));
  EXPECT_EQ(Value("wsync_syncs_in_flight", {{"transfer", "b"}}), 0);
}

TEST_F(MetricsTest, SuccessFeedsDurationPhasesBytesAndLastSuccess) {
  const double before = UnixSeconds(absl::Now());
  metrics_.SyncFinished("succeeded", Status("a@1#1", "a", 2.0));
  metrics_.SyncFinished("succeeded", Status("a@2#2", "a", 3.0));
  metrics_.SyncFinished("failed", Status("a@3#3", "a", 4.0));
  EXPECT_EQ(Value("wsync_syncs_total", {{"transfer", "a"}, {"outcome", "succeeded"}}), 2);
  EXPECT_EQ(Value("wsync_syncs_total", {{"transfer", "a"}, {"outcome", "failed"}}), 1);
  EXPECT_EQ(Count("wsync_sync_duration_seconds", {{"transfer", "a"}}), 2);
  EXPECT_EQ(BucketCount("wsync_sync_duration_seconds", {{"transfer", "a"}}, 2.5), 1);
  for (const char* phase : ControllerMetrics::kPhases) {
    EXPECT_EQ(Count("wsync_sync_phase_seconds", {{"transfer", "a"}, {"phase", phase}}), 2) << phase;
  }
  // bind took 0.2 s: above the 0.1 bucket, within 0.25.
  EXPECT_EQ(BucketCount("wsync_sync_phase_seconds", {{"transfer", "a"}, {"phase", "bind"}}, 0.1),
            0);
  EXPECT_EQ(BucketCount("wsync_sync_phase_seconds", {{"transfer", "a"}, {"phase", "bind"}}, 0.25),
            2);
  EXPECT_EQ(Value("wsync_sync_bytes_total", {{"transfer", "a"}}), 2000);
  EXPECT_EQ(Value("wsync_sync_bytes", {{"transfer", "a"}}), 1000);
  EXPECT_GE(Value("wsync_sync_last_success_timestamp_seconds", {{"transfer", "a"}}), before);
}

TEST_F(MetricsTest, RestoredTransferKeepsItsVersionAndSaveTime) {
  const absl::Time saved = absl::FromUnixSeconds(1700000000);
  metrics_.TransferRestored("a", 12, saved);
  metrics_.TransferRestored("b", 0, saved);  // never delivered: no last success
  EXPECT_EQ(Value("wsync_weight_version", {{"transfer", "a"}}), 12);
  EXPECT_EQ(Value("wsync_sync_last_success_timestamp_seconds", {{"transfer", "a"}}), 1700000000);
  EXPECT_EQ(Value("wsync_sync_last_success_timestamp_seconds", {{"transfer", "b"}}), -1);
}

TEST_F(MetricsTest, LeaseChurnAndBuildInfo) {
  metrics_.WorkerRegistered();
  metrics_.WorkerRegistered();
  metrics_.LeaseLost();
  EXPECT_EQ(Value("wsync_worker_registrations_total", {}), 2);
  EXPECT_EQ(Value("wsync_worker_leases_lost_total", {}), 1);
  const BuildInfo info = GetBuildInfo();
  EXPECT_FALSE(info.version.empty());
  EXPECT_FALSE(info.git_commit.empty());
  EXPECT_EQ(Value("wsync_build_info", {{"component", "controller"},
                                       {"version", info.version},
                                       {"git_commit", info.git_commit}}),
            1);
}

}  // namespace
}  // namespace wsync::controller
