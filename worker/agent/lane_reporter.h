// The worker's side of the control fast lane (--controller_lane;
// controller/server/lane_server.h): its ReportResult calls go over the
// controller's Unix socket instead of gRPC. The connection is bound to the
// worker's lease (LaneHello) and re-bound when the lease changes. When the
// lane is absent, refuses the worker (its Hello, or a report answered
// UNAUTHENTICATED: the lane admits by the lease and the certificate it
// registered with, gRPC by the certificate each call presents) or breaks,
// Report says so (nullopt) and the caller reports over gRPC, which delivers
// it or refuses it as it would without the lane; the lane is tried again
// kRetryAfter later. Each such fall-back is logged as a warning.
//
// Thread-safe (calls are serialized).
#ifndef WSYNC_WORKER_AGENT_LANE_REPORTER_H_
#define WSYNC_WORKER_AGENT_LANE_REPORTER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/lane_client.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::agent {

class LaneReporter {
 public:
  static constexpr absl::Duration kRetryAfter = absl::Seconds(10);

  // `path`: the controller's --lane_socket; empty: off (Report always
  // nullopt). `who` names the worker in warnings.
  LaneReporter(std::string path, std::string who) : path_(std::move(path)), who_(std::move(who)) {}

  bool enabled() const { return !path_.empty(); }
  const std::string& who() const { return who_; }
  // Sends `r` (its lease_id set) over the lane, bounded by `deadline`: the
  // controller's status of the report, or nullopt when the lane could not
  // carry it or refused the worker (report over gRPC then).
  std::optional<absl::Status> Report(const v1::ReportResultRequest& r, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Connected and bound to `lease`; false (after a warning) otherwise.
  bool ReadyLocked(const std::string& lease, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GiveUpLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const std::string who_;
  absl::Mutex mu_;
  std::unique_ptr<LaneClient> client_ ABSL_GUARDED_BY(mu_);
  std::string bound_lease_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LANE_REPORTER_H_
