// What the owner process serves, per group of this worker (SetServing on the
// local API or the embedded worker): the weight version and the owner's state
// (serving, paused, updating, failed), with an optional replica label. The
// agent sends these to the controller with every heartbeat (at once after a
// change: `TakeChanged`) and the worker's metrics export them.
#ifndef WSYNC_WORKER_AGENT_SERVING_H_
#define WSYNC_WORKER_AGENT_SERVING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

class ServingTable {
 public:
  explicit ServingTable(std::vector<v1::Membership> memberships);

  // INVALID_ARGUMENT (naming the group) for a group this worker is not in, a
  // missing state, a negative version or replica size. Keeps the owner's
  // clock time of the call.
  absl::Status Set(const v1::SetServingRequest& req);
  // One report per group that was set, with this worker's last synced version.
  std::vector<v1::ServingReport> Reports(int64_t last_synced_version);
  // True once after each Set or MarkUnsent (the heartbeat then goes at once).
  bool TakeChanged();
  // A new lease has not heard the reports: the next heartbeat goes at once
  // (no-op while nothing was set).
  void MarkUnsent();

 private:
  const std::vector<v1::Membership> memberships_;
  absl::Mutex mu_;
  std::map<std::string, v1::ServingReport> by_group_ ABSL_GUARDED_BY(mu_);
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_SERVING_H_
