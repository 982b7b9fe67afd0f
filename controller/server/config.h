// The controller's settings, shared by its state owners (worker_registry.h,
// sync_coordinator.h).
#ifndef WSYNC_CONTROLLER_SERVER_CONFIG_H_
#define WSYNC_CONTROLLER_SERVER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "controller/plan/stacking_mode.h"

namespace wsync::controller {

// Bounds on what one request can make the controller hold or do (docs/api.md,
// "Limits"). Each is a flag of wsync-controller, named in the error that
// enforces it (RESOURCE_EXHAUSTED for quotas, INVALID_ARGUMENT for requests
// out of range).
struct ControllerLimits {
  // Smallest PlanOptions.bucket_bytes a trainer may ask for (0: the default).
  int64_t min_bucket_bytes = 64ll << 10;  // --min_bucket_bytes
  // Most buckets and pieces one plan may have (a Kimi-K2 plan has ~0.31 M
  // buckets and ~0.63 M pieces).
  int64_t max_plan_buckets = 2'000'000;  // --max_plan_buckets
  int64_t max_plan_pieces = 4'000'000;   // --max_plan_pieces
  // Tensor stacking for specs over max_plan_pieces (planner.h
  // BuildOptions::stacking; --plan_stacking auto, on or off).
  plan::StackingMode plan_stacking = plan::StackingMode::kAuto;
  // Bytes the plan cache may keep (plan_cache.h: the plans' arenas; a
  // Kimi-K2 plan takes ~0.5 GB).
  int64_t plan_cache_bytes = 4ll << 30;  // --plan_cache_bytes
  // Longest deadline a Sync may ask for.
  absl::Duration max_sync_deadline = absl::Hours(1);  // --max_sync_deadline
  // Largest step of a Sync's version over the transfer's last successful one.
  int64_t max_version_jump = int64_t{1} << 32;  // --max_version_jump
  // Rendezvous quota of one scope (one transfer generation).
  int64_t kv_scope_bytes = 64ll << 20;  // --kv_scope_bytes
  int64_t kv_scope_keys = 65536;        // --kv_scope_keys
  // Longest a KvGet / AwaitWriters / WaitSync may wait in one call.
  absl::Duration max_wait = absl::Minutes(10);  // --max_wait
  // Blocking waits and watchers (WaitSync, WatchSync, Sync with wait_ms,
  // KvGet with timeout_ms, AwaitWriters) open at once.
  int64_t max_waiters = 16384;  // --max_waiters
  // The low-latency mode (common/busy_poll.h): how long the wait hub's
  // thread spins after its last signal before it sleeps; zero: off,
  // InfiniteDuration: always (--busy_poll_ms).
  absl::Duration busy_poll = absl::ZeroDuration();
  // One ListWorkers page: workers, and buffers listed over its workers.
  int32_t list_page_workers = 100;     // --list_workers_page_size
  int64_t list_page_buffers = 10'000;  // --list_workers_page_buffers
};

struct ControllerConfig {
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration sync_deadline = absl::Seconds(120);
  // How long a failure a worker reports about its peers waits for its cause
  // (a peer's loss, the other workers' reports) before it settles; also how
  // long past its deadline a sync waits for the workers' own deadline
  // reports (sync_coordinator.h). --failure_grace.
  absl::Duration failure_grace = absl::Seconds(1);
  std::string instance;  // random per controller start
  // Let worker pairs of one memory domain write destinations directly
  // (buckets routed ROUTE_PEER_WRITE); off: every bucket goes through the
  // transport.
  bool direct_writes = true;
  // Order each writer's direct writes in put phases, matchings of the sync's
  // peer-write byte matrix (controller/plan/put_phases.h); off: every writer
  // issues its puts in round order, all peers at once.
  bool put_phases = true;
  // Warm-ups (docs/warm-up.md): prepare every worker of a transfer (op
  // lists, bindings, peer mappings, transport, staging) when it is defined
  // and whenever its workers change, so that its first sync runs as fast as
  // the next. wsync-controller's --warm_up_on_define defaults to true; off
  // here so that a coordinator built in a test sends only what it is asked.
  bool warm_up_on_define = false;
  // A warm-up not reported by every worker by then fails (the next sync sets
  // up by itself). --warm_up_deadline.
  absl::Duration warm_up_deadline = absl::Seconds(60);
  ControllerLimits limits;
  // TEST ONLY (--test_crash_after_commits, accepted only with
  // WSYNC_TEST_FAILPOINTS=1): -1 off. N >= 0: at a staged sync's commit
  // decision, send CommitSync to its first N receivers only, and SIGKILL this
  // process once they confirmed (N = 0: right after the decision is saved):
  // a controller killed between the first and the last CommitSync
  // (docs/staging.md, tests/chaos/staged_commit_crash.py).
  int32_t test_crash_after_commits = -1;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_CONFIG_H_
