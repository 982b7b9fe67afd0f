// The controller's Prometheus metrics (pull exposer on /metrics). Base units,
// no tensor names or peer pairs as labels.
#ifndef WSYNC_CONTROLLER_SERVER_METRICS_H_
#define WSYNC_CONTROLLER_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics_endpoint.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace wsync::controller {

class ControllerMetrics {
 public:
  ControllerMetrics();

  // Serves /metrics on `bind_address` ("127.0.0.1:0" picks a port).
  absl::Status Serve(const std::string& bind_address);
  int port() const;  // 0 when not serving

  void SyncFinished(const std::string& outcome, double seconds, double bytes);
  void PlanBuilt(double seconds);
  void PlanCacheHit() { cache_hits_->Increment(); }
  void PlanCacheMiss() { cache_misses_->Increment(); }
  void SetWorkers(int registered, int alive) {
    workers_registered_->Set(registered);
    workers_alive_->Set(alive);
  }
  void SetWeightVersion(const std::string& transfer, double version);
  // One save of the controller state (state_store.h): its wall time, and a
  // count of the saves that failed.
  void StateSaved(bool ok, double seconds);
  // The replicas of `group` (serving_board.h): per replica the version every
  // rank serves (0 unless serving) and its state, one series per state set to
  // 1 / 0. The series of the group's replicas not listed are removed.
  struct ReplicaGauge {
    std::string replica;
    std::string state;
    double version = 0;
  };
  void SetReplicas(const std::string& group, const std::vector<ReplicaGauge>& replicas);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  MetricsEndpoint endpoint_;
  prometheus::Family<prometheus::Counter>* syncs_total_;
  prometheus::Histogram* sync_duration_;
  prometheus::Gauge* sync_bytes_;
  prometheus::Gauge* workers_registered_;
  prometheus::Gauge* workers_alive_;
  prometheus::Histogram* plan_duration_;
  prometheus::Counter* cache_hits_;
  prometheus::Counter* cache_misses_;
  prometheus::Histogram* state_save_duration_;
  prometheus::Counter* state_save_failures_;
  prometheus::Family<prometheus::Gauge>* weight_version_;
  prometheus::Family<prometheus::Gauge>* replica_version_;
  prometheus::Family<prometheus::Gauge>* replica_state_;
  absl::Mutex replicas_mu_;
  // group -> replica labels with series.
  std::map<std::string, std::set<std::string>> replicas_exported_ ABSL_GUARDED_BY(replicas_mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_METRICS_H_
