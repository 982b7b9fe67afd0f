// SyncRunner op-list cache: an assignment dropped before it ran still leaves
// its op list for the later syncs that reference its part key.
#include "worker/agent/sync_runner.h"

#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/worker/agent/test_assignment.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

using testing::TestAssignment;

TEST(SyncRunnerTest, APlanCachedFromADroppedAssignmentServesLaterSyncs) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable tensors({"g"}, &backend);
  SyncRunner runner(&tensors, nullptr, RunnerOptions{absl::Seconds(10), 0, &backend});
  // Without the list: refused, naming the part.
  v1::ReportResultRequest none = runner.Run(TestAssignment("s1", false), nullptr, "lease", nullptr);
  EXPECT_EQ(none.code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(none.message().find("no cached op list for plan k/0"), std::string::npos)
      << none.message();
  // ... and tells the controller to send it again.
  ASSERT_EQ(none.dropped_part_keys_size(), 1);
  EXPECT_EQ(none.dropped_part_keys(0), "k/0");
  // The assignment that carried it was dropped unrun (aborted while queued).
  runner.CachePlan(TestAssignment("s2", true));
  v1::ReportResultRequest later =
      runner.Run(TestAssignment("s3", false), nullptr, "lease", nullptr);
  EXPECT_EQ(later.code(), 0) << later.message();
}

}  // namespace
}  // namespace wsync::agent
