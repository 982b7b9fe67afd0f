#include "controller/server/metrics.h"

#include "absl/strings/str_cat.h"

namespace wsync::controller {

ControllerMetrics::ControllerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  syncs_total_ = &prometheus::BuildCounter()
                      .Name("wsync_syncs_total")
                      .Help("Weight syncs that ended, by outcome (succeeded, failed, cancelled).")
                      .Register(*registry_);
  for (const char* outcome : {"succeeded", "failed", "cancelled"}) {
    syncs_total_->Add({{"outcome", outcome}});
  }
  sync_duration_ = &prometheus::BuildHistogram()
                        .Name("wsync_sync_duration_seconds")
                        .Help("Trigger to last worker report, successful syncs.")
                        .Register(*registry_)
                        .Add({}, DurationSecondsBuckets());
  sync_bytes_ = &prometheus::BuildGauge()
                     .Name("wsync_sync_bytes")
                     .Help("Destination bytes written by the last successful sync.")
                     .Register(*registry_)
                     .Add({});
  workers_registered_ = &prometheus::BuildGauge()
                             .Name("wsync_workers_registered")
                             .Help("Worker leases known to the controller.")
                             .Register(*registry_)
                             .Add({});
  workers_alive_ = &prometheus::BuildGauge()
                        .Name("wsync_workers_alive")
                        .Help("Worker leases with a recent heartbeat and an open stream.")
                        .Register(*registry_)
                        .Add({});
  plan_duration_ = &prometheus::BuildHistogram()
                        .Name("wsync_plan_duration_seconds")
                        .Help("Wall time of building a plan (cache misses).")
                        .Register(*registry_)
                        .Add({}, DurationSecondsBuckets());
  cache_hits_ = &prometheus::BuildCounter()
                     .Name("wsync_plan_cache_hits_total")
                     .Help("Plan lookups answered from the plan cache.")
                     .Register(*registry_)
                     .Add({});
  cache_misses_ = &prometheus::BuildCounter()
                       .Name("wsync_plan_cache_misses_total")
                       .Help("Plan lookups that had to plan.")
                       .Register(*registry_)
                       .Add({});
  state_save_duration_ =
      &prometheus::BuildHistogram()
           .Name("wsync_state_save_duration_seconds")
           .Help("Wall time of saving the controller state (--state_file), failed saves too.")
           .Register(*registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                            0.05, 0.1, 0.5});
  state_save_failures_ = &prometheus::BuildCounter()
                              .Name("wsync_state_save_failures_total")
                              .Help("Saves of the controller state (--state_file) that failed.")
                              .Register(*registry_)
                              .Add({});
  weight_version_ = &prometheus::BuildGauge()
                         .Name("wsync_weight_version")
                         .Help("Last successfully synced weight version, per transfer.")
                         .Register(*registry_);
  replica_version_ = &prometheus::BuildGauge()
                          .Name("wsync_replica_serving_version")
                          .Help(
                              "The weight version every rank of a replica serves (0 unless all "
                              "serve one version), per destination group and replica label.")
                          .Register(*registry_);
  replica_state_ = &prometheus::BuildGauge()
                        .Name("wsync_replica_state")
                        .Help(
                            "1 for a replica's current state (serving, mixed, paused, "
                            "updating, failed, incomplete), 0 for the others.")
                        .Register(*registry_);
}

absl::Status ControllerMetrics::Serve(const std::string& bind_address) {
  return endpoint_.Serve(bind_address, registry_);
}

int ControllerMetrics::port() const { return endpoint_.port(); }

void ControllerMetrics::SyncFinished(const std::string& outcome, double seconds, double bytes) {
  syncs_total_->Add({{"outcome", outcome}}).Increment();
  if (outcome == "succeeded") {
    sync_duration_->Observe(seconds);
    sync_bytes_->Set(bytes);
  }
}

void ControllerMetrics::PlanBuilt(double seconds) { plan_duration_->Observe(seconds); }

void ControllerMetrics::StateSaved(bool ok, double seconds) {
  state_save_duration_->Observe(seconds);
  if (!ok) state_save_failures_->Increment();
}

void ControllerMetrics::SetWeightVersion(const std::string& transfer, double version) {
  weight_version_->Add({{"transfer", transfer}}).Set(version);
}

void ControllerMetrics::SetReplicas(const std::string& group,
                                    const std::vector<ReplicaGauge>& replicas) {
  static constexpr const char* kStates[] = {"serving",  "mixed",  "paused",
                                            "updating", "failed", "incomplete"};
  absl::MutexLock lock(&replicas_mu_);
  std::set<std::string>& exported = replicas_exported_[group];
  std::set<std::string> now;
  for (const ReplicaGauge& r : replicas) {
    replica_version_->Add({{"group", group}, {"replica", r.replica}}).Set(r.version);
    for (const char* s : kStates) {
      replica_state_->Add({{"group", group}, {"replica", r.replica}, {"state", s}})
          .Set(r.state == s ? 1 : 0);
    }
    now.insert(r.replica);
  }
  for (const std::string& gone : exported) {
    if (now.count(gone) != 0) continue;
    replica_version_->Remove(&replica_version_->Add({{"group", group}, {"replica", gone}}));
    for (const char* s : kStates) {
      replica_state_->Remove(
          &replica_state_->Add({{"group", group}, {"replica", gone}, {"state", s}}));
    }
  }
  exported = std::move(now);
}

}  // namespace wsync::controller
