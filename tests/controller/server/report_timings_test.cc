// Hostile control-path times (ReportResultRequest 10-17) from workers with
// real leases: SyncStatus stays finite and within the sync's own age, and the
// outcome is unaffected (issue 18 leftovers, item 1).
#include "controller/server/report_timings.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ReportTimingsTest = controller_testing::CoordinatorFixture;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Every time SyncStatus publishes, as (name, value).
std::map<std::string, double> Times(const v1::SyncStatus& s) {
  return {{"setup", s.max_setup_seconds()},     {"execute", s.max_execute_seconds()},
          {"deliver", s.max_deliver_seconds()}, {"queue", s.max_queue_seconds()},
          {"bind", s.max_bind_seconds()},       {"run", s.max_run_seconds()},
          {"report", s.max_report_seconds()}};
}

// One hostile report per worker: NaN, infinities, negatives, huge values,
// and timestamps at the ends of int64 (far past, far future).
std::vector<v1::ReportResultRequest> HostileReports() {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t future = absl::ToUnixMicros(absl::Now() + absl::Hours(24 * 365));
  std::vector<v1::ReportResultRequest> out(3);
  out[0].set_setup_seconds(kNaN);
  out[0].set_execute_seconds(-kInf);
  out[0].set_queued_seconds(kNaN);
  out[0].set_bind_seconds(kInf);
  out[0].set_run_seconds(-1e300);
  out[0].set_received_unix_us(kMax);
  out[0].set_reported_unix_us(1);
  out[1].set_setup_seconds(1e300);
  out[1].set_execute_seconds(-5);
  out[1].set_queued_seconds(1e18);
  out[1].set_bind_seconds(-kInf);
  out[1].set_run_seconds(1e300);
  out[1].set_received_unix_us(1);
  out[1].set_reported_unix_us(kMax);
  out[2].set_setup_seconds(std::numeric_limits<double>::denorm_min());
  out[2].set_execute_seconds(std::numeric_limits<double>::max());
  out[2].set_queued_seconds(-0.0);
  out[2].set_bind_seconds(kNaN);
  out[2].set_run_seconds(kNaN);
  out[2].set_received_unix_us(future);
  out[2].set_reported_unix_us(future);
  return out;
}

TEST_F(ReportTimingsTest, HostileTimesLeaveSyncStatusFiniteAndTheOutcomeUnchanged) {
  const std::vector<std::string> leases = {Register("a", "src", 0, 2, 16),
                                           Register("b", "src", 1, 2, 16),
                                           Register("c", "dst", 0, 1, 32)};
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : leases) tokens[l] = *controller_->workers().OpenStream(l);
  DefineSimple();
  const absl::Time before = absl::Now();
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  std::vector<v1::ReportResultRequest> reports = HostileReports();
  for (size_t i = 0; i < leases.size(); ++i) {
    v1::SyncAssignment a = Next(leases[i], tokens[leases[i]]);
    reports[i].set_lease_id(leases[i]);
    reports[i].set_sync_id(a.sync_id());
    ASSERT_TRUE(controller_->syncs().ReportResult(reports[i]).ok());
  }
  auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(st.ok()) << st.status();
  const double age = absl::ToDoubleSeconds(absl::Now() - before);
  EXPECT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  EXPECT_EQ(st->workers_done(), 3);
  for (const auto& [name, value] : Times(*st)) {
    EXPECT_TRUE(std::isfinite(value)) << name << " = " << value;
    EXPECT_GE(value, 0.0) << name;
    EXPECT_LE(value, age) << name << " exceeds the sync's own age";
  }
  // The clamp reached the maxima (a dashboard sees "as long as the sync").
  EXPECT_GT(st->max_run_seconds(), 0.0);
  EXPECT_GT(st->max_deliver_seconds(), 0.0);
  // The next sync with honest reports still records honest times.
  auto next = StartSync(2);
  ASSERT_TRUE(next.ok()) << next.status();
  for (const auto& l : leases) ReportOk(l, Next(l, tokens[l]));
  auto st2 = controller_->syncs().WaitSync(next->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(st2.ok()) << st2.status();
  EXPECT_EQ(st2->phase(), v1::SYNC_SUCCEEDED) << st2->error();
}

TEST(SaneSecondsTest, IgnoresNonFiniteAndNegativeAndClampsToTheSyncsAge) {
  const absl::Duration age = absl::Seconds(2);
  EXPECT_EQ(SaneSeconds(kNaN, age), 0.0);
  EXPECT_EQ(SaneSeconds(kInf, age), 0.0);
  EXPECT_EQ(SaneSeconds(-kInf, age), 0.0);
  EXPECT_EQ(SaneSeconds(-1.0, age), 0.0);
  EXPECT_EQ(SaneSeconds(1e300, age), 2.0);
  EXPECT_EQ(SaneSeconds(0.5, age), 0.5);
  EXPECT_EQ(SaneSeconds(0.5, -age), 0.0) << "a negative age (clock step) clamps to 0";
}

TEST(RecordReportTimingsTest, TimestampsYieldSpansWithinTheSyncsAge) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  const absl::Time pushed = start + absl::Milliseconds(10);
  const absl::Time now = start + absl::Seconds(3);
  v1::ReportResultRequest r;
  r.set_received_unix_us(absl::ToUnixMicros(pushed + absl::Milliseconds(250)));
  r.set_reported_unix_us(absl::ToUnixMicros(now - absl::Milliseconds(500)));
  r.set_run_seconds(1.5);
  v1::SyncStatus s;
  RecordReportTimings(r, start, pushed, now, s);
  EXPECT_DOUBLE_EQ(s.max_deliver_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(s.max_report_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(s.max_run_seconds(), 1.5);
  // A later, smaller report never lowers a maximum; a skewed one reads 0.
  v1::ReportResultRequest skewed;
  skewed.set_received_unix_us(absl::ToUnixMicros(pushed - absl::Seconds(9)));
  skewed.set_run_seconds(0.1);
  RecordReportTimings(skewed, start, pushed, now, s);
  EXPECT_DOUBLE_EQ(s.max_deliver_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(s.max_run_seconds(), 1.5);
}

}  // namespace
}  // namespace wsync::controller
