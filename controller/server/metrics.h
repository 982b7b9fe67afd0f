// The controller's Prometheus metrics (pull exposer on /metrics). Base units,
// no tensor names or peer pairs as labels. Every metric is listed in
// docs/flags-and-metrics.md ("Metrics").
//
// Per-transfer series carry a `transfer` label of bounded cardinality: the
// first `max_transfer_labels` transfer names seen (--metrics_max_transfers)
// keep their own value, later ones share kOverflowTransfer.
#ifndef WSYNC_CONTROLLER_SERVER_METRICS_H_
#define WSYNC_CONTROLLER_SERVER_METRICS_H_

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics_endpoint.h"
#include "controller/server/state_store.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

class ControllerMetrics {
 public:
  // The `transfer` label value shared by transfers past the cap.
  static constexpr const char* kOverflowTransfer = "_other";
  static constexpr int kDefaultMaxTransferLabels = 16;  // --metrics_max_transfers

  explicit ControllerMetrics(int max_transfer_labels = kDefaultMaxTransferLabels);

  // Serves /metrics on `bind_address` ("127.0.0.1:0" picks a port).
  absl::Status Serve(const std::string& bind_address);
  int port() const;  // 0 when not serving

  // The label value `transfer` is exported under (its own name while under
  // the cap, kOverflowTransfer past it). Stable: a name keeps its value.
  std::string TransferLabel(const std::string& transfer);

  // Sync `sync_id` of `transfer` started; `deadline` is when the controller
  // ends it. It counts as in flight until SyncFinished names it.
  void SyncStarted(const std::string& sync_id, const std::string& transfer, absl::Time deadline);
  // A sync ended (`outcome`: succeeded, failed or cancelled) with the final
  // status `s`. Successful syncs also feed the duration, phase, byte and
  // last-success series.
  void SyncFinished(const std::string& outcome, const v1::SyncStatus& s);
  // A warm-up ended (`outcome`: warm or failed) after `seconds`; counted
  // apart from the syncs (docs/warm-up.md).
  void WarmUpFinished(const std::string& outcome, double seconds);
  // A restarted controller's saved state: `transfer` last delivered
  // `version` no later than `saved` (the time the state was saved).
  void TransferRestored(const std::string& transfer, int64_t version, absl::Time saved);
  // Worker lease churn (worker_registry.h): a registration, a lease that died.
  void WorkerRegistered() { registrations_->Increment(); }
  void LeaseLost() { leases_lost_->Increment(); }
  void PlanBuilt(double seconds);
  void PlanCacheHit() { cache_hits_->Increment(); }
  void PlanCacheMiss() { cache_misses_->Increment(); }
  void SetWorkers(int registered, int alive) {
    workers_registered_->Set(registered);
    workers_alive_->Set(alive);
  }
  void SetWeightVersion(const std::string& transfer, double version);
  // The phases SyncFinished observes (label `phase`), in SyncStatus order.
  static constexpr std::array<const char*, 7> kPhases = {"plan", "dispatch", "deliver", "queue",
                                                         "bind", "run",      "report"};
  // One save of the controller state (state_store.h): its wall time, and a
  // count of the saves that failed.
  void StateSaved(bool ok, double seconds);
  // Counts each failed background flush of `store` (its flusher) in
  // wsync_state_save_failures_total. Call before its first save.
  void CountFlushFailuresOf(StateStore* store);
  // The replicas of `group` (serving_board.h): per replica the version every
  // rank serves (0 unless serving) and its state, one series per state set to
  // 1 / 0. The series of the group's replicas not listed are removed.
  struct ReplicaGauge {
    std::string replica;
    std::string state;
    double version = 0;
  };
  void SetReplicas(const std::string& group, const std::vector<ReplicaGauge>& replicas);
  // wsync_replica_committed_version{transfer, replica}: the version every
  // rank of the replica confirmed last (docs/staging-rollout.md, "Rolling waves").
  void SetCommittedVersion(const std::string& transfer, const std::string& replica, double version);

  prometheus::Registry& registry() { return *registry_; }

 private:
  void ObservePhases(const std::string& label, const v1::SyncStatus& s);
  // Sets the in-flight and deadline gauges of `label` from in_flight_syncs_.
  void ExportInFlightLocked(const std::string& label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(labels_mu_);

  struct InFlight {
    std::string label;
    absl::Time deadline;
  };

  const int max_transfer_labels_;
  std::shared_ptr<prometheus::Registry> registry_;
  MetricsEndpoint endpoint_;
  absl::Mutex labels_mu_;
  std::set<std::string> transfer_labels_ ABSL_GUARDED_BY(labels_mu_);
  std::map<std::string, InFlight> in_flight_syncs_ ABSL_GUARDED_BY(labels_mu_);  // by sync id
  prometheus::Family<prometheus::Counter>* syncs_total_;
  prometheus::Family<prometheus::Histogram>* sync_duration_;
  prometheus::Family<prometheus::Histogram>* phase_duration_;
  prometheus::Family<prometheus::Gauge>* sync_bytes_;
  prometheus::Family<prometheus::Counter>* bytes_total_;
  prometheus::Family<prometheus::Gauge>* last_success_;
  prometheus::Family<prometheus::Gauge>* in_flight_;
  prometheus::Family<prometheus::Gauge>* deadline_;
  prometheus::Counter* registrations_;
  prometheus::Counter* leases_lost_;
  prometheus::Gauge* workers_registered_;
  prometheus::Gauge* workers_alive_;
  prometheus::Histogram* plan_duration_;
  prometheus::Family<prometheus::Counter>* warm_ups_total_;
  prometheus::Histogram* warm_up_duration_;
  prometheus::Counter* cache_hits_;
  prometheus::Counter* cache_misses_;
  prometheus::Histogram* state_save_duration_;
  prometheus::Counter* state_save_failures_;
  prometheus::Family<prometheus::Gauge>* weight_version_;
  prometheus::Family<prometheus::Gauge>* replica_version_;
  prometheus::Family<prometheus::Gauge>* replica_state_;
  prometheus::Family<prometheus::Gauge>* replica_committed_;
  absl::Mutex replicas_mu_;
  // group -> replica labels with series.
  std::map<std::string, std::set<std::string>> replicas_exported_ ABSL_GUARDED_BY(replicas_mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_METRICS_H_
