#include "worker/agent/worker_metrics.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/serving_state.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

WorkerMetrics::WorkerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  RegisterBuildInfo(*registry_, "worker");
  // Rounds are short; a worker's part of a sync lasts up to the sync's
  // deadline, so its buckets reach past --max_sync_deadline's default.
  const prometheus::Histogram::BucketBoundaries round_seconds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  bytes_sent_ = &prometheus::BuildCounter()
                     .Name("wsync_worker_bytes_sent_total")
                     .Help("Bytes this worker sent over the data plane.")
                     .Register(*registry_)
                     .Add({});
  bytes_received_ = &prometheus::BuildCounter()
                         .Name("wsync_worker_bytes_received_total")
                         .Help("Bytes this worker received over the data plane.")
                         .Register(*registry_)
                         .Add({});
  auto& direct = prometheus::BuildCounter()
                     .Name("wsync_worker_direct_write_bytes_total")
                     .Help(
                         "Bytes written directly into mapped peer buffers (direction=\"out\") "
                         "or into this worker's by peers (\"in\"); part of the sent / received "
                         "bytes.")
                     .Register(*registry_);
  direct_out_ = &direct.Add({{"direction", "out"}});
  direct_in_ = &direct.Add({{"direction", "in"}});
  auto& gates = prometheus::BuildCounter()
                    .Name("wsync_worker_put_gates_total")
                    .Help(
                        "Phase gates between this worker's direct-write put phases: all issued "
                        "(outcome=\"issued\") and those that opened by their timeout because a "
                        "peer signalled too late (\"timed_out\").")
                    .Register(*registry_);
  put_gates_ = &gates.Add({{"outcome", "issued"}});
  put_gates_timed_out_ = &gates.Add({{"outcome", "timed_out"}});
  round_duration_ = &prometheus::BuildHistogram()
                         .Name("wsync_worker_round_duration_seconds")
                         .Help("Wall time of one plan round on this worker.")
                         .Register(*registry_)
                         .Add({}, round_seconds);
  sync_duration_ = &prometheus::BuildHistogram()
                        .Name("wsync_worker_sync_duration_seconds")
                        .Help("Wall time of this worker's part of a sync (setup included).")
                        .Register(*registry_)
                        .Add({}, SyncSecondsBuckets());
  staging_bytes_ = &prometheus::BuildGauge()
                        .Name("wsync_worker_staging_bytes")
                        .Help("Staging memory allocated by this worker's executors.")
                        .Register(*registry_)
                        .Add({});
  slow_peer_mappings_ =
      &prometheus::BuildGauge()
           .Name("wsync_worker_slow_peer_mappings")
           .Help(
               "Peer GPU allocations this worker maps for direct writes whose size is not a "
               "multiple of 64 KiB (the copy engines write those ~25 % slower).")
           .Register(*registry_)
           .Add({});
  errors_ = &prometheus::BuildCounter()
                 .Name("wsync_worker_errors_total")
                 .Help("Syncs this worker ended with an error, by status code.")
                 .Register(*registry_);
  serving_version_ = &prometheus::BuildGauge()
                          .Name("wsync_worker_serving_version")
                          .Help("The weight version the owner serves, per group (SetServing).")
                          .Register(*registry_);
  serving_state_ = &prometheus::BuildGauge()
                        .Name("wsync_worker_serving_state")
                        .Help(
                            "1 for the owner's current state (serving, paused, updating, "
                            "failed), 0 for the others, per group.")
                        .Register(*registry_);
  auto& warm_ups = prometheus::BuildCounter()
                       .Name("wsync_worker_warm_ups_total")
                       .Help("Warm-up assignments this worker ran (not syncs), by outcome.")
                       .Register(*registry_);
  warm_ups_ok_ = &warm_ups.Add({{"outcome", "warm"}});
  warm_ups_failed_ = &warm_ups.Add({{"outcome", "failed"}});
  warm_up_duration_ = &prometheus::BuildHistogram()
                           .Name("wsync_worker_warm_up_duration_seconds")
                           .Help("Wall time of this worker's part of a warm-up.")
                           .Register(*registry_)
                           .Add({}, SyncSecondsBuckets());
  channels_created_ =
      &prometheus::BuildCounter()
           .Name("wsync_worker_channels_created_total")
           .Help(
               "Data-plane channels (transports, their rendezvous and connections) this worker "
               "built, by syncs and warm-ups together.")
           .Register(*registry_)
           .Add({});
  // Zero series for the usual codes, so that rates work before the first error.
  for (absl::StatusCode c : {absl::StatusCode::kAborted, absl::StatusCode::kCancelled,
                             absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable,
                             absl::StatusCode::kFailedPrecondition,
                             absl::StatusCode::kInvalidArgument, absl::StatusCode::kInternal}) {
    errors_->Add({{"code", absl::AsciiStrToLower(absl::StatusCodeToString(c))}});
  }
}

absl::Status WorkerMetrics::Serve(const std::string& bind_address) {
  return endpoint_.Serve(bind_address, registry_);
}

int WorkerMetrics::port() const { return endpoint_.port(); }

void WorkerMetrics::Error(absl::StatusCode code) {
  errors_->Add({{"code", absl::AsciiStrToLower(absl::StatusCodeToString(code))}}).Increment();
}

void WorkerMetrics::Serving(const std::string& group, int64_t version, const std::string& state) {
  serving_version_->Add({{"group", group}}).Set(static_cast<double>(version));
  for (const char* s : kServingStateNames) {
    serving_state_->Add({{"group", group}, {"state", s}}).Set(state == s ? 1 : 0);
  }
}

}  // namespace wsync::agent
