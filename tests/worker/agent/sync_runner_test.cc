// SyncRunner op-list cache: an assignment dropped before it ran still leaves
// its op list for the later syncs that reference its part key.
#include "worker/agent/sync_runner.h"

#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

// An assignment of worker 0's part "k/0"; with `plan`, the part itself (a
// worker with nothing to move: no rounds, no transport).
v1::SyncAssignment Assignment(const std::string& sync_id, bool plan) {
  v1::SyncAssignment a;
  a.set_sync_id(sync_id);
  a.set_transfer("t");
  a.set_version(1);
  a.set_plan_key("k");
  a.set_worker(0);
  a.set_part_key("k/0");
  a.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Seconds(10)));
  if (plan) {
    a.mutable_plan()->set_key("k");
    a.mutable_plan()->add_ranks()->set_worker(0);
  }
  return a;
}

TEST(SyncRunnerTest, APlanCachedFromADroppedAssignmentServesLaterSyncs) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable tensors({"g"}, &backend);
  SyncRunner runner(&tensors, nullptr, RunnerOptions{absl::Seconds(10), 0, &backend});
  // Without the list: refused, naming the part.
  v1::ReportResultRequest none = runner.Run(Assignment("s1", false), nullptr, "lease", nullptr);
  EXPECT_EQ(none.code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(none.message().find("no cached op list for plan k/0"), std::string::npos)
      << none.message();
  // ... and tells the controller to send it again.
  ASSERT_EQ(none.dropped_part_keys_size(), 1);
  EXPECT_EQ(none.dropped_part_keys(0), "k/0");
  // The assignment that carried it was dropped unrun (aborted while queued).
  runner.CachePlan(Assignment("s2", true));
  v1::ReportResultRequest later = runner.Run(Assignment("s3", false), nullptr, "lease", nullptr);
  EXPECT_EQ(later.code(), 0) << later.message();
}

}  // namespace
}  // namespace wsync::agent
