// Steps of wsync-demo's syncs through the trainer API of a local cluster:
// waiting for a sync, and a sync that loses a worker mid-way.
#ifndef WSYNC_TOOLS_DEMO_SYNC_STEPS_H_
#define WSYNC_TOOLS_DEMO_SYNC_STEPS_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tools/demo/cluster.h"
#include "tools/demo/owner.h"

namespace wsync::demo {

// fn(ClientContext*) with a 60 s deadline.
template <typename Fn>
grpc::Status CallWithDeadline(Fn fn) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return fn(&ctx);
}

// Polls WaitSync until sync `id` leaves RUNNING (or `stop` is set); the last
// status is in *st.
grpc::Status WaitUntilDone(Cluster& cluster, const std::string& id, const std::atomic<bool>& stop,
                           v1::SyncStatus* st);

// Polls GetStatus until transfer `name`'s warm-up (docs/warm-up.md) is no
// longer RUNNING, `timeout` passed or `stop` is set; returns its status
// (OFF when warm-ups are off).
absl::StatusOr<v1::WarmUpStatus> AwaitWarmUp(Cluster& cluster, const std::string& name,
                                             absl::Duration timeout, const std::atomic<bool>& stop);

// Freezes worker `victim`, starts the sync of version `v` of transfer
// "demo", kills the worker while its peers wait for it in the rendezvous or
// a round, and checks that the sync fails (naming it) within its deadline;
// then restarts the worker and has its owners (src_owner[r] runs on worker
// src_worker[r], likewise dst) register again. Prints what happened.
absl::Status KillMidSync(Cluster& cluster, int v, int victim, const std::vector<int>& src_worker,
                         const std::vector<int>& dst_worker,
                         std::vector<std::unique_ptr<Owner>>& src_owner,
                         std::vector<std::unique_ptr<Owner>>& dst_owner,
                         const std::atomic<bool>& stop);

// What wsync-demo measured of one version's sync.
struct VersionFigures {
  int version = 0;
  double wall_s = 0, fill_s = 0, verify_s = 0;  // Sync call to done; filling; checking
  int64_t checked_bytes = 0, wrong = 0;
  bool result_line = false;  // also print the RESULT line
};

// The version's result line ("v<N> <sync id>: ... wrong") and, with
// f.result_line, the same figures as one machine-readable line
// 'RESULT {"bench":"wsync_demo",...}' (bench/gpu/run_two_nodes.sh reads it),
// on stdout, flushed.
void PrintVersionLines(const VersionFigures& f, const v1::SyncResponse& sresp,
                       const v1::SyncStatus& st);

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_SYNC_STEPS_H_
