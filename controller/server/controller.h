// The controller's state, free of gRPC: three owners, each with its own lock
// and tests, wired together here.
//  - WorkerRegistry (worker_registry.h): leases, assignment streams, buffers.
//  - Rendezvous (rendezvous.h): the transports' key-value scopes.
//  - SyncCoordinator (sync_coordinator.h): transfers, plans and their worker
//    parts, routes, syncs.
//  - ServingBoard (serving_board.h): the versions the owners serve, by
//    replica; it calls no other owner.
// Lock order: SyncCoordinator -> WorkerRegistry, SyncCoordinator ->
// Rendezvous and SyncCoordinator -> ServingBoard (replica labels; the
// coordinator calls them while holding its lock); the
// registry and the rendezvous never call another owner while holding theirs.
// A lost lease reaches the coordinator (its syncs fail) and the rendezvous
// (waiting Gets end) through the registry's loss listener, outside the
// registry's lock.
#ifndef WSYNC_CONTROLLER_SERVER_CONTROLLER_H_
#define WSYNC_CONTROLLER_SERVER_CONTROLLER_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "controller/server/config.h"
#include "controller/server/metrics.h"
#include "controller/server/plan_source.h"
#include "controller/server/rendezvous.h"
#include "controller/server/serving_board.h"
#include "controller/server/state_store.h"
#include "controller/server/sync_coordinator.h"
#include "controller/server/worker_registry.h"

namespace wsync::controller {

class Controller {
 public:
  // `metrics` and `store` may be null (no state persists); what is given
  // must outlive the controller.
  Controller(const ControllerConfig& config, ControllerMetrics* metrics, PlanSource* plans,
             StateStore* store = nullptr);
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  WorkerRegistry& workers() { return workers_; }
  Rendezvous& rendezvous() { return rendezvous_; }
  SyncCoordinator& syncs() { return syncs_; }
  // The waits and watchers the services hold (wait_hub.h).
  WaitHub& waits() { return waits_; }
  const ControllerLimits& limits() const { return limits_; }
  ServingBoard& serving() { return serving_; }

  // WorkerRegistry::RegisterWorker, then the staged syncs whose commit is
  // decided and awaits this worker (SyncCoordinator::Rejoin) in the
  // response's decided_commits.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& req, const std::string& identity,
      const std::string& previous_lease, const LeaseCertificate& certificate = {});

  // A heartbeat's serving reports: recorded for the lease's groups.
  // NOT_FOUND for a lease that is not alive, INVALID_ARGUMENT (serving_board.h).
  absl::Status RecordServing(const std::string& lease_id,
                             const google::protobuf::RepeatedPtrField<v1::ServingReport>& reports);
  // WorkerRegistry::ListWorkers with each worker's serving_versions (the
  // versions it committed, SyncCoordinator::AddServingVersions).
  v1::ListWorkersResponse ListWorkers(const std::string& group);
  // What each replica of `group` serves, from its live holders and reports.
  v1::ReplicasResponse Replicas(const std::string& group);

  // Expires leases, then sync deadlines; refreshes the replica gauges (every
  // kServingExportPeriod). Call periodically.
  void Tick();
  // Ends every stream and wait promptly (server shutdown).
  void Shutdown();

  // A second listener of the coordinator's and the rendezvous' changes,
  // beside the wait hub: the control fast lane's (lane_server.h), which
  // answers its own waits. Set before the controller serves (no call may run
  // concurrently) and only then; it must not take an owner's lock.
  void SetChangeObserver(std::function<void()> observer) { observer_ = std::move(observer); }

 private:
  const ControllerLimits limits_;
  WaitHub waits_;                   // first: outlives the owners that notify it
  std::function<void()> observer_;  // SetChangeObserver; may be empty
  WorkerRegistry workers_;
  Rendezvous rendezvous_;
  SyncCoordinator syncs_;
  ServingBoard serving_;
  // Tick() refreshes the replica gauges at most this often.
  static constexpr absl::Duration kServingExportPeriod = absl::Milliseconds(500);
  std::atomic<int64_t> next_serving_export_ms_{0};
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_CONTROLLER_H_
