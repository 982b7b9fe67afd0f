#include "controller/server/controller.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::controller {

Controller::Controller(const ControllerConfig& config, ControllerMetrics* metrics,
                       PlanSource* plans, StateStore* store)
    : limits_(config.limits),
      waits_(config.limits.max_waiters, config.limits.busy_poll),
      workers_(config, metrics),
      rendezvous_([this](const std::string& lease) { return workers_.IsAlive(lease); },
                  Rendezvous::Quota{config.limits.kv_scope_bytes, config.limits.kv_scope_keys}),
      syncs_(config, metrics, plans, &workers_, &rendezvous_, store),
      serving_(metrics) {
  auto changed = [this] {
    waits_.NotifyAll();
    if (observer_) observer_();
  };
  rendezvous_.SetChangeListener(changed);
  syncs_.SetChangeListener(changed);
  // The board is a leaf: the coordinator asks it under its own lock.
  syncs_.SetReplicaLabeler(
      [this](const std::string& group, int32_t rank, const std::string& lease) {
        return serving_.LabelOf(group, rank, lease);
      });
  workers_.SetLossListener([this](const WorkerLoss& loss) {
    syncs_.WorkerLost(loss);
    rendezvous_.WakeAll();
  });
}

absl::StatusOr<v1::RegisterWorkerResponse> Controller::RegisterWorker(
    const v1::RegisterWorkerRequest& req, const std::string& identity,
    const std::string& previous_lease, const LeaseCertificate& certificate) {
  absl::StatusOr<v1::RegisterWorkerResponse> resp =
      workers_.RegisterWorker(req, identity, previous_lease, certificate);
  if (resp.ok()) syncs_.Rejoin(resp->lease_id(), req, &*resp);
  return resp;
}

void Controller::Tick() {
  workers_.Tick();
  syncs_.Tick();
  syncs_.WarmUpTick();
  // The replica gauges need not follow every 25 ms tick.
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  int64_t due = next_serving_export_ms_.load();
  if (now_ms < due || !next_serving_export_ms_.compare_exchange_strong(
                          due, now_ms + absl::ToInt64Milliseconds(kServingExportPeriod))) {
    return;
  }
  for (const std::string& group : serving_.Groups()) serving_.Export(Replicas(group));
}

absl::Status Controller::RecordServing(
    const std::string& lease_id,
    const google::protobuf::RepeatedPtrField<v1::ServingReport>& reports) {
  if (reports.empty()) return absl::OkStatus();
  std::optional<WorkerSnapshot> w = workers_.Find(lease_id);
  if (!w.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("serving reports of lease ", lease_id, ": the lease is not alive"));
  }
  return serving_.Record(lease_id, w->info->memberships(), reports, absl::Now());
}

v1::ReplicasResponse Controller::Replicas(const std::string& group) {
  WorkerRegistry::Group g = workers_.FindGroup(group);
  GroupHolders holders;
  holders.size = g.size;
  for (const auto& rank : g.ranks) holders.leases.push_back(rank ? rank->lease_id : "");
  return serving_.Replicas(group, holders, absl::Now());
}

v1::ListWorkersResponse Controller::ListWorkers(const std::string& group) {
  v1::ListWorkersResponse resp = workers_.ListWorkers(group);
  syncs_.AddServingVersions(&resp);
  return resp;
}

void Controller::Shutdown() {
  workers_.Shutdown();
  rendezvous_.Shutdown();
  syncs_.Shutdown();
}

}  // namespace wsync::controller
