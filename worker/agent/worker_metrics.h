// The worker's Prometheus metrics (pull exposer on /metrics). Base units; the
// labels are the error's status code name and, for the serving metrics, the
// group and the owner's state.
#ifndef WSYNC_WORKER_AGENT_WORKER_METRICS_H_
#define WSYNC_WORKER_AGENT_WORKER_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/metrics_endpoint.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace wsync::agent {

class WorkerMetrics {
 public:
  WorkerMetrics();
  absl::Status Serve(const std::string& bind_address);
  int port() const;

  void AddBytes(double sent, double received) {
    bytes_sent_->Increment(sent);
    bytes_received_->Increment(received);
  }
  // Direct writes (included in AddBytes too): written into peers / into
  // this worker by peers.
  void AddDirectBytes(double out, double in) {
    direct_out_->Increment(out);
    direct_in_->Increment(in);
  }
  // Phase gates of a sync's puts (worker/exec/phase_gates.h): issued, and
  // of them those that opened by their timeout (a stalled or dead peer).
  void PutGates(double issued, double timed_out) {
    put_gates_->Increment(issued);
    put_gates_timed_out_->Increment(timed_out);
  }
  void Round(double seconds) { round_duration_->Observe(seconds); }
  void Sync(double seconds) { sync_duration_->Observe(seconds); }
  void Staging(double bytes) { staging_bytes_->Set(bytes); }
  void SlowPeerMappings(double count) { slow_peer_mappings_->Set(count); }
  void Error(absl::StatusCode code);
  // Warm-ups (docs/warm-up.md), apart from the syncs: their outcome and time.
  void WarmUp(bool ok, double seconds) {
    (ok ? warm_ups_ok_ : warm_ups_failed_)->Increment();
    warm_up_duration_->Observe(seconds);
  }
  // The sync runner's count of channels (transports) built so far.
  void ChannelsCreated(int64_t total) {
    const double delta = static_cast<double>(total) - channels_created_->Value();
    if (delta > 0) channels_created_->Increment(delta);
  }
  // What the owner serves for `group` (SetServing): the version and the
  // state, one series per state ("serving", "paused", "updating", "failed")
  // set to 1 / 0.
  void Serving(const std::string& group, int64_t version, const std::string& state);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  MetricsEndpoint endpoint_;
  prometheus::Counter* bytes_sent_;
  prometheus::Counter* bytes_received_;
  prometheus::Counter* direct_out_;
  prometheus::Counter* direct_in_;
  prometheus::Counter* put_gates_;
  prometheus::Counter* put_gates_timed_out_;
  prometheus::Histogram* round_duration_;
  prometheus::Histogram* sync_duration_;
  prometheus::Gauge* staging_bytes_;
  prometheus::Gauge* slow_peer_mappings_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Counter* warm_ups_ok_;
  prometheus::Counter* warm_ups_failed_;
  prometheus::Histogram* warm_up_duration_;
  prometheus::Counter* channels_created_;
  prometheus::Family<prometheus::Gauge>* serving_version_;
  prometheus::Family<prometheus::Gauge>* serving_state_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_WORKER_METRICS_H_
