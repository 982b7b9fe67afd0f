// ServingBoard: what the owners of a destination group's ranks serve, as
// their workers relay it (SetServing on the worker, then every heartbeat),
// aggregated per replica for TrainerService.Replicas and the metrics.
//
// A replica is one model copy: the ranks of a group whose owners report the
// same `replica` label (e.g. the TP ranks of one vLLM server). Ranks that
// report no label, and live ranks that have reported nothing yet, form the
// group's unlabelled replica "". A replica serves version V only when every
// rank it expects is held by a live lease that reported SERVING at V. It
// expects the largest `replica_ranks` its ranks reported (or the ranks it
// has); the unlabelled replica expects every rank of the group not reported
// under a label.
//
// A report is tied to the lease that sent it: once that lease is lost or
// the rank is held by another lease, the rank counts as not live (stale
// report kept for display), until the new holder reports. Reports of lost
// leases are forgotten after `forget_after`.
//
// Locking: one mutex, held only inside a call; the board calls no other
// owner (the controller passes it the group's holders).
#ifndef WSYNC_CONTROLLER_SERVER_SERVING_BOARD_H_
#define WSYNC_CONTROLLER_SERVER_SERVING_BOARD_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/server/metrics.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// The live leases of a group, by rank ("": rank not held); size -1 when no
// live worker is in the group.
struct GroupHolders {
  int32_t size = -1;
  std::vector<std::string> leases;
};

class ServingBoard {
 public:
  // `metrics` may be null.
  explicit ServingBoard(ControllerMetrics* metrics,
                        absl::Duration forget_after = absl::Minutes(10));
  ServingBoard(const ServingBoard&) = delete;
  ServingBoard& operator=(const ServingBoard&) = delete;

  // Records the reports of lease `lease_id` whose memberships are
  // `memberships`. INVALID_ARGUMENT (nothing recorded) when a report names a
  // group the lease is not in, repeats a group, or has no state.
  absl::Status Record(const std::string& lease_id,
                      const google::protobuf::RepeatedPtrField<v1::Membership>& memberships,
                      const google::protobuf::RepeatedPtrField<v1::ServingReport>& reports,
                      absl::Time now);

  // The replicas of `group` given its live holders.
  v1::ReplicasResponse Replicas(const std::string& group, const GroupHolders& holders,
                                absl::Time now);
  // The replica label the owner of `rank` of `group` reported while held by
  // lease `lease_id` ("" when none, or reported by another lease).
  std::string LabelOf(const std::string& group, int32_t rank, const std::string& lease_id);
  // Groups with reports or with replica gauges (for the metrics refresh).
  std::vector<std::string> Groups();
  // Sets the replica gauges of `r`, removing those of replicas it no longer
  // has (no-op without metrics).
  void Export(const v1::ReplicasResponse& r);

 private:
  struct Entry {
    std::string lease_id;
    v1::ServingReport report;
    absl::Time received;
  };

  ControllerMetrics* const metrics_;
  const absl::Duration forget_after_;
  absl::Mutex mu_;
  // group -> rank -> the last report for it.
  std::map<std::string, std::map<int32_t, Entry>> groups_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> exported_ ABSL_GUARDED_BY(mu_);  // groups with gauges
};

// "serving", "mixed", ... (the replica metric's state label and wsyncctl's;
// a rank's state: wsync::ServingStateName in common/serving_state.h).
const char* ReplicaStateName(v1::ReplicaState s);

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_SERVING_BOARD_H_
