#include "controller/server/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::controller {
namespace {

double UnixSeconds(absl::Time t) { return static_cast<double>(absl::ToUnixMicros(t)) / 1e6; }

}  // namespace

ControllerMetrics::ControllerMetrics(int max_transfer_labels)
    : max_transfer_labels_(max_transfer_labels),
      registry_(std::make_shared<prometheus::Registry>()) {
  RegisterBuildInfo(*registry_, "controller");
  syncs_total_ = &prometheus::BuildCounter()
                      .Name("wsync_syncs_total")
                      .Help(
                          "Weight syncs that ended, by transfer and outcome (succeeded, failed, "
                          "cancelled).")
                      .Register(*registry_);
  sync_duration_ = &prometheus::BuildHistogram()
                        .Name("wsync_sync_duration_seconds")
                        .Help("Trigger to last worker report, successful syncs, by transfer.")
                        .Register(*registry_);
  phase_duration_ =
      &prometheus::BuildHistogram()
           .Name("wsync_sync_phase_seconds")
           .Help(
               "Successful syncs' phases by transfer: plan, dispatch (controller side) and the "
               "slowest worker's deliver, queue, bind, run, report (SyncStatus max_*_seconds).")
           .Register(*registry_);
  sync_bytes_ = &prometheus::BuildGauge()
                     .Name("wsync_sync_bytes")
                     .Help("Destination bytes written by the last successful sync, by transfer.")
                     .Register(*registry_);
  bytes_total_ = &prometheus::BuildCounter()
                      .Name("wsync_sync_bytes_total")
                      .Help("Destination bytes written by successful syncs, by transfer.")
                      .Register(*registry_);
  last_success_ = &prometheus::BuildGauge()
                       .Name("wsync_sync_last_success_timestamp_seconds")
                       .Help(
                           "Unix time the last successful sync of a transfer ended (after a "
                           "restart: when the restored state was saved).")
                       .Register(*registry_);
  in_flight_ = &prometheus::BuildGauge()
                    .Name("wsync_syncs_in_flight")
                    .Help("Syncs started and not yet ended, by transfer.")
                    .Register(*registry_);
  deadline_ = &prometheus::BuildGauge()
                   .Name("wsync_sync_deadline_timestamp_seconds")
                   .Help(
                       "Unix time of the earliest deadline among a transfer's syncs in flight; "
                       "0 when none is in flight.")
                   .Register(*registry_);
  registrations_ = &prometheus::BuildCounter()
                        .Name("wsync_worker_registrations_total")
                        .Help("Worker registrations accepted (each starts a lease).")
                        .Register(*registry_)
                        .Add({});
  leases_lost_ = &prometheus::BuildCounter()
                      .Name("wsync_worker_leases_lost_total")
                      .Help(
                          "Worker leases that died: expired heartbeat, closed assignment stream "
                          "or replaced by a new registration of the same instance.")
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
  warm_ups_total_ = &prometheus::BuildCounter()
                         .Name("wsync_warm_ups_total")
                         .Help("Warm-ups of transfers (not syncs), by outcome (warm, failed).")
                         .Register(*registry_);
  warm_up_duration_ = &prometheus::BuildHistogram()
                           .Name("wsync_warm_up_duration_seconds")
                           .Help("Wall time of a warm-up, start to its last worker's report.")
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
  state_save_failures_ =
      &prometheus::BuildCounter()
           .Name("wsync_state_save_failures_total")
           .Help(
               "Saves of the controller state (--state_file) that failed: not written, "
               "or (--state_fsync=background) not flushed to the disk, "
               "once per failed flush.")
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
  replica_committed_ = &prometheus::BuildGauge()
                            .Name("wsync_replica_committed_version")
                            .Help(
                                "The weight version every rank of a replica confirmed last (the "
                                "controller's view; rolling waves, docs/staging.md), per "
                                "transfer and replica label.")
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

std::string ControllerMetrics::TransferLabel(const std::string& transfer) {
  absl::MutexLock lock(&labels_mu_);
  if (transfer_labels_.count(transfer) != 0) return transfer;
  if (static_cast<int>(transfer_labels_.size()) >= max_transfer_labels_) return kOverflowTransfer;
  transfer_labels_.insert(transfer);
  // Zero series, so that rates and "no failures" work before the first sync.
  for (const char* outcome : {"succeeded", "failed", "cancelled"}) {
    syncs_total_->Add({{"transfer", transfer}, {"outcome", outcome}});
  }
  in_flight_->Add({{"transfer", transfer}});
  deadline_->Add({{"transfer", transfer}});
  return transfer;
}

void ControllerMetrics::SyncStarted(const std::string& sync_id, const std::string& transfer,
                                    absl::Time deadline) {
  const std::string label = TransferLabel(transfer);
  absl::MutexLock lock(&labels_mu_);
  in_flight_syncs_[sync_id] = InFlight{label, deadline};
  ExportInFlightLocked(label);
}

void ControllerMetrics::ExportInFlightLocked(const std::string& label) {
  int count = 0;
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [id, f] : in_flight_syncs_) {
    if (f.label != label) continue;
    ++count;
    earliest = std::min(earliest, f.deadline);
  }
  in_flight_->Add({{"transfer", label}}).Set(count);
  deadline_->Add({{"transfer", label}}).Set(count == 0 ? 0 : UnixSeconds(earliest));
}

void ControllerMetrics::WarmUpFinished(const std::string& outcome, double seconds) {
  warm_ups_total_->Add({{"outcome", outcome}}).Increment();
  warm_up_duration_->Observe(seconds);
}

void ControllerMetrics::SyncFinished(const std::string& outcome, const v1::SyncStatus& s) {
  const std::string label = TransferLabel(s.transfer());
  {
    absl::MutexLock lock(&labels_mu_);
    if (in_flight_syncs_.erase(s.sync_id()) != 0) ExportInFlightLocked(label);
  }
  syncs_total_->Add({{"transfer", label}, {"outcome", outcome}}).Increment();
  if (outcome != "succeeded") return;
  sync_duration_->Add({{"transfer", label}}, SyncSecondsBuckets()).Observe(s.elapsed_seconds());
  ObservePhases(label, s);
  const double bytes = static_cast<double>(s.bytes_total());
  sync_bytes_->Add({{"transfer", label}}).Set(bytes);
  bytes_total_->Add({{"transfer", label}}).Increment(bytes);
  last_success_->Add({{"transfer", label}}).Set(UnixSeconds(absl::Now()));
}

void ControllerMetrics::ObservePhases(const std::string& label, const v1::SyncStatus& s) {
  const double seconds[] = {s.plan_seconds(),      s.dispatch_seconds(), s.max_deliver_seconds(),
                            s.max_queue_seconds(), s.max_bind_seconds(), s.max_run_seconds(),
                            s.max_report_seconds()};
  static_assert(sizeof(seconds) / sizeof(seconds[0]) == kPhases.size());
  for (size_t i = 0; i < kPhases.size(); ++i) {
    phase_duration_->Add({{"transfer", label}, {"phase", kPhases[i]}}, SyncSecondsBuckets())
        .Observe(seconds[i]);
  }
}

void ControllerMetrics::TransferRestored(const std::string& transfer, int64_t version,
                                         absl::Time saved) {
  const std::string label = TransferLabel(transfer);
  weight_version_->Add({{"transfer", label}}).Set(static_cast<double>(version));
  if (version > 0) last_success_->Add({{"transfer", label}}).Set(UnixSeconds(saved));
}

void ControllerMetrics::PlanBuilt(double seconds) { plan_duration_->Observe(seconds); }

void ControllerMetrics::StateSaved(bool ok, double seconds) {
  state_save_duration_->Observe(seconds);
  if (!ok) state_save_failures_->Increment();
}

void ControllerMetrics::CountFlushFailuresOf(StateStore* store) {
  prometheus::Counter* failures = state_save_failures_;
  store->SetFlushFailureListener(
      [failures](const absl::Status&, int64_t) { failures->Increment(); });
}

void ControllerMetrics::SetWeightVersion(const std::string& transfer, double version) {
  weight_version_->Add({{"transfer", TransferLabel(transfer)}}).Set(version);
}

void ControllerMetrics::SetCommittedVersion(const std::string& transfer, const std::string& replica,
                                            double version) {
  replica_committed_->Add({{"transfer", transfer}, {"replica", replica}}).Set(version);
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
