#include "controller/server/services.h"

#include "absl/time/clock.h"
#include "common/lease_metadata.h"

namespace wsync::controller {

namespace {
// How often blocked handlers look at client cancellation.
constexpr absl::Duration kPoll = absl::Milliseconds(50);

template <typename T>
grpc::Status Fill(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return ToGrpc(result.status());
  *out = *std::move(result);
  return grpc::Status::OK;
}
}  // namespace

absl::Status WorkerServiceImpl::Admit(const grpc::ServerContext& ctx, const std::string& lease_id,
                                      absl::string_view method) {
  absl::StatusOr<Caller> caller = auth_->RequireWorker(ctx, method);
  if (!caller.ok()) return caller.status();
  return controller_->workers().CheckCaller(lease_id, caller->identity, method);
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                               const v1::RegisterWorkerRequest* req,
                                               v1::RegisterWorkerResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireWorker(*ctx, "RegisterWorker");
  if (!caller.ok()) return ToGrpc(caller.status());
  if (absl::Status st = auth_->CheckGroups(*caller, *req); !st.ok()) return ToGrpc(st);
  const auto& md = ctx->client_metadata();
  auto previous = md.find(kPreviousLeaseMetadata);
  const std::string previous_lease =
      previous == md.end() ? "" : std::string(previous->second.data(), previous->second.size());
  return Fill(controller_->workers().RegisterWorker(*req, caller->identity, previous_lease), resp);
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                          v1::HeartbeatResponse* resp) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "Heartbeat"); !st.ok()) return ToGrpc(st);
  grpc::Status s = Fill(controller_->workers().Heartbeat(req->lease_id()), resp);
  if (!s.ok()) return s;
  return ToGrpc(controller_->RecordServing(req->lease_id(), req->serving()));
}

grpc::Status WorkerServiceImpl::UpdateBuffers(grpc::ServerContext* ctx,
                                              const v1::UpdateBuffersRequest* req,
                                              v1::UpdateBuffersResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "UpdateBuffers"); !st.ok()) return ToGrpc(st);
  return ToGrpc(controller_->workers().UpdateBuffers(*req));
}

grpc::Status WorkerServiceImpl::Assignments(grpc::ServerContext* ctx,
                                            const v1::AssignmentsRequest* req,
                                            grpc::ServerWriter<v1::Assignment>* writer) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "Assignments"); !st.ok()) return ToGrpc(st);
  absl::StatusOr<uint64_t> token = controller_->workers().OpenStream(req->lease_id());
  if (!token.ok()) return ToGrpc(token.status());
  // Headers now, so that the worker knows the stream is established.
  writer->SendInitialMetadata();
  while (true) {
    if (ctx->IsCancelled()) {
      controller_->workers().CloseStream(req->lease_id(), *token, "worker disconnected");
      return grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled");
    }
    auto next = controller_->workers().NextAssignment(req->lease_id(), *token, kPoll);
    if (!next.ok()) return ToGrpc(next.status());
    if (!next->has_value()) continue;
    if (!writer->Write(**next)) {
      controller_->workers().CloseStream(req->lease_id(), *token, "write to worker failed");
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
    }
  }
}

grpc::Status WorkerServiceImpl::ReportProgress(grpc::ServerContext* ctx,
                                               const v1::ReportProgressRequest* req,
                                               v1::ReportProgressResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "ReportProgress"); !st.ok()) return ToGrpc(st);
  return ToGrpc(controller_->syncs().ReportProgress(*req));
}

grpc::Status WorkerServiceImpl::ReportResult(grpc::ServerContext* ctx,
                                             const v1::ReportResultRequest* req,
                                             v1::ReportResultResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "ReportResult"); !st.ok()) return ToGrpc(st);
  return ToGrpc(controller_->syncs().ReportResult(*req));
}

grpc::Status WorkerServiceImpl::KvSet(grpc::ServerContext* ctx, const v1::KvSetRequest* req,
                                      v1::KvSetResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "KvSet"); !st.ok()) return ToGrpc(st);
  return ToGrpc(controller_->rendezvous().Set(*req));
}

grpc::Status WorkerServiceImpl::KvGet(grpc::ServerContext* ctx, const v1::KvGetRequest* req,
                                      v1::KvGetResponse* resp) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "KvGet"); !st.ok()) return ToGrpc(st);
  return Fill(controller_->rendezvous().Get(*req), resp);
}

grpc::Status WorkerServiceImpl::AwaitWriters(grpc::ServerContext* ctx,
                                             const v1::AwaitWritersRequest* req,
                                             v1::AwaitWritersResponse* resp) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "AwaitWriters"); !st.ok()) return ToGrpc(st);
  return Fill(controller_->syncs().AwaitWriters(*req), resp);
}

grpc::Status TrainerServiceImpl::DefineTransfer(grpc::ServerContext* ctx,
                                                const v1::DefineTransferRequest* req,
                                                v1::DefineTransferResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kTrainer, "DefineTransfer");
  if (!caller.ok()) return ToGrpc(caller.status());
  return Fill(controller_->syncs().DefineTransfer(*req), resp);
}

grpc::Status TrainerServiceImpl::Plan(grpc::ServerContext* ctx, const v1::PlanRequest* req,
                                      v1::PlanResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "Plan");
  if (!caller.ok()) return ToGrpc(caller.status());
  return Fill(controller_->syncs().PlanTransfer(*req), resp);
}

grpc::Status TrainerServiceImpl::Sync(grpc::ServerContext* ctx, const v1::SyncRequest* req,
                                      v1::SyncResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kTrainer, "Sync");
  if (!caller.ok()) return ToGrpc(caller.status());
  if (req->wait_ms() < 0) {
    return ToGrpc(
        absl::InvalidArgumentError(absl::StrCat("Sync: negative wait_ms ", req->wait_ms())));
  }
  grpc::Status started = Fill(controller_->syncs().StartSync(*req, caller->identity), resp);
  if (!started.ok() || req->wait_ms() == 0) return started;
  return AwaitEnd(ctx, resp->sync_id(), absl::Now() + absl::Milliseconds(req->wait_ms()),
                  resp->mutable_status());
}

grpc::Status TrainerServiceImpl::AwaitEnd(grpc::ServerContext* ctx, const std::string& sync_id,
                                          absl::Time until, v1::SyncStatus* out) {
  // Waits in slices so that a client that gave up frees the thread.
  int64_t seen = -1;
  while (true) {
    auto status = controller_->syncs().NextSyncUpdate(sync_id, &seen, kPoll * 4);
    if (!status.ok()) return ToGrpc(status.status());
    if (status->phase() != v1::SYNC_RUNNING || absl::Now() >= until || ctx->IsCancelled()) {
      *out = *std::move(status);
      return grpc::Status::OK;
    }
  }
}

grpc::Status TrainerServiceImpl::WaitSync(grpc::ServerContext* ctx, const v1::WaitSyncRequest* req,
                                          v1::SyncStatus* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "WaitSync");
  if (!caller.ok()) return ToGrpc(caller.status());
  const absl::Time until = req->timeout_ms() > 0
                               ? absl::Now() + absl::Milliseconds(req->timeout_ms())
                               : absl::InfiniteFuture();
  return AwaitEnd(ctx, req->sync_id(), until, resp);
}

grpc::Status TrainerServiceImpl::WatchSync(grpc::ServerContext* ctx,
                                           const v1::WatchSyncRequest* req,
                                           grpc::ServerWriter<v1::SyncStatus>* writer) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "WatchSync");
  if (!caller.ok()) return ToGrpc(caller.status());
  int64_t seen = -1;
  while (!ctx->IsCancelled()) {
    const int64_t before = seen;
    auto status = controller_->syncs().NextSyncUpdate(req->sync_id(), &seen, kPoll * 4);
    if (!status.ok()) return ToGrpc(status.status());
    if (seen != before || status->phase() != v1::SYNC_RUNNING) {
      if (!writer->Write(*status)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone");
    }
    if (status->phase() != v1::SYNC_RUNNING) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away");
}

grpc::Status TrainerServiceImpl::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                           v1::GetStatusResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "GetStatus");
  if (!caller.ok()) return ToGrpc(caller.status());
  *resp = controller_->syncs().GetStatus();
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* req,
                                        v1::SyncStatus* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kTrainer, "Cancel");
  if (!caller.ok()) return ToGrpc(caller.status());
  return Fill(controller_->syncs().Cancel(req->sync_id(), req->reason(), caller->identity,
                                          caller->role >= Role::kAdmin),
              resp);
}

grpc::Status TrainerServiceImpl::ListWorkers(grpc::ServerContext* ctx,
                                             const v1::ListWorkersRequest* req,
                                             v1::ListWorkersResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "ListWorkers");
  if (!caller.ok()) return ToGrpc(caller.status());
  *resp = controller_->workers().ListWorkers(req->group());
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::Replicas(grpc::ServerContext* ctx, const v1::ReplicasRequest* req,
                                          v1::ReplicasResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "Replicas");
  if (!caller.ok()) return ToGrpc(caller.status());
  if (req->group().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Replicas: name the destination group");
  }
  *resp = controller_->Replicas(req->group());
  return grpc::Status::OK;
}

}  // namespace wsync::controller
