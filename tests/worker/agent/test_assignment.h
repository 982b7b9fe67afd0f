// An assignment for SyncRunner tests (sync_runner_test.cc,
// shadow_swap_test.cc).
#ifndef WSYNC_TESTS_WORKER_AGENT_TEST_ASSIGNMENT_H_
#define WSYNC_TESTS_WORKER_AGENT_TEST_ASSIGNMENT_H_

#include <string>

#include "absl/time/clock.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::agent::testing {

// Worker 0's part "k/0" of transfer "t", version 1, due in 10 s; with
// `plan`, the part itself (a worker with nothing to move: no rounds, no
// transport; callers add the names it touches).
inline v1::SyncAssignment TestAssignment(const std::string& sync_id, bool plan) {
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

}  // namespace wsync::agent::testing

#endif  // WSYNC_TESTS_WORKER_AGENT_TEST_ASSIGNMENT_H_
