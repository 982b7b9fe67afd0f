#include "controller/server/services.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lease_metadata.h"
#include "controller/server/assignment_stream.h"
#include "controller/server/handlers.h"

namespace wsync::controller {

namespace {
template <typename T>
grpc::Status Fill(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return ToGrpc(result.status());
  *out = *std::move(result);
  return grpc::Status::OK;
}
}  // namespace

absl::Status WorkerServiceImpl::Admit(const grpc::ServerContextBase& ctx,
                                      const std::string& lease_id, absl::string_view method) {
  if (lease_id.empty()) {  // never a lease: register first (RegisterWorker)
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": no lease_id; a worker registers first (RegisterWorker)"));
  }
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
  return Fill(controller_->RegisterWorker(*req, caller->identity, previous_lease,
                                          Authenticator::PresentedCertificate(*ctx)),
              resp);
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

grpc::ServerWriteReactor<v1::Assignment>* WorkerServiceImpl::Assignments(
    grpc::CallbackServerContext* ctx, const v1::AssignmentsRequest* req) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "Assignments"); !st.ok()) {
    return RefuseAssignments(ToGrpc(st));
  }
  return AssignmentStream::Start(&controller_->workers(), req->lease_id());
}

grpc::Status WorkerServiceImpl::ReportProgress(grpc::ServerContext* ctx,
                                               const v1::ReportProgressRequest* req,
                                               v1::ReportProgressResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "ReportProgress"); !st.ok()) return ToGrpc(st);
  return ToGrpc(controller_->syncs().ReportProgress(*req));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportResult(grpc::CallbackServerContext* ctx,
                                                          const v1::ReportResultRequest* req,
                                                          v1::ReportResultResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "ReportResult"); !st.ok()) {
    return Answer(ctx, ToGrpc(st));
  }
  return Answer(ctx, ToGrpc(ReportResultCall(*controller_, *req)));
}

grpc::Status WorkerServiceImpl::KvSet(grpc::ServerContext* ctx, const v1::KvSetRequest* req,
                                      v1::KvSetResponse*) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "KvSet"); !st.ok()) return ToGrpc(st);
  return ToGrpc(controller_->rendezvous().Set(*req));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvGet(grpc::CallbackServerContext* ctx,
                                                   const v1::KvGetRequest* req,
                                                   v1::KvGetResponse* resp) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "KvGet"); !st.ok()) {
    return Answer(ctx, ToGrpc(st));
  }
  if (req->timeout_ms() <= 0) return Answer(ctx, Fill(controller_->rendezvous().Get(*req), resp));
  const absl::Duration wait =
      std::min(absl::Milliseconds(req->timeout_ms()), controller_->limits().max_wait);
  // Each poll looks once (timeout 0); the hub waits between polls.
  auto once = std::make_shared<v1::KvGetRequest>(*req);
  once->set_timeout_ms(0);
  Controller* controller = controller_;
  return PolledUnary::Start(
      &controller_->waits(), absl::Now() + wait,
      [controller, once, wait, resp](bool expired) -> std::optional<grpc::Status> {
        absl::StatusOr<v1::KvGetResponse> got = controller->rendezvous().Get(*once);
        if (got.status().code() == absl::StatusCode::kDeadlineExceeded) {
          if (!expired) return std::nullopt;
          return ToGrpc(absl::DeadlineExceededError(
              absl::StrCat("KvGet: waited ", absl::FormatDuration(wait),
                           " (timeout_ms, at most --max_wait); ", got.status().message())));
        }
        return Fill(std::move(got), resp);
      });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::AwaitWriters(grpc::CallbackServerContext* ctx,
                                                          const v1::AwaitWritersRequest* req,
                                                          v1::AwaitWritersResponse* resp) {
  if (absl::Status st = Admit(*ctx, req->lease_id(), "AwaitWriters"); !st.ok()) {
    return Answer(ctx, ToGrpc(st));
  }
  auto once = std::make_shared<v1::AwaitWritersRequest>(*req);
  once->set_timeout_ms(0);
  if (req->timeout_ms() <= 0) {
    return Answer(ctx, Fill(controller_->syncs().AwaitWriters(*once), resp));
  }
  const absl::Duration wait =
      std::min(absl::Milliseconds(req->timeout_ms()), controller_->limits().max_wait);
  Controller* controller = controller_;
  return PolledUnary::Start(&controller_->waits(), absl::Now() + wait,
                            [controller, once, resp](bool expired) -> std::optional<grpc::Status> {
                              absl::StatusOr<v1::AwaitWritersResponse> got =
                                  controller->syncs().AwaitWriters(*once);
                              if (got.ok() && !got->pending().empty() && !expired)
                                return std::nullopt;
                              return Fill(std::move(got), resp);
                            });
}

grpc::Status TrainerServiceImpl::DefineTransfer(grpc::ServerContext* ctx,
                                                const v1::DefineTransferRequest* req,
                                                v1::DefineTransferResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kTrainer, "DefineTransfer");
  if (!caller.ok()) return ToGrpc(caller.status());
  return Fill(controller_->syncs().DefineTransfer(*req, AsTrainer(*caller)), resp);
}

grpc::Status TrainerServiceImpl::Plan(grpc::ServerContext* ctx, const v1::PlanRequest* req,
                                      v1::PlanResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "Plan");
  if (!caller.ok()) return ToGrpc(caller.status());
  return Fill(controller_->syncs().PlanTransfer(*req), resp);
}

grpc::ServerUnaryReactor* TrainerServiceImpl::Sync(grpc::CallbackServerContext* ctx,
                                                   const v1::SyncRequest* req,
                                                   v1::SyncResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kTrainer, "Sync");
  if (!caller.ok()) return Answer(ctx, ToGrpc(caller.status()));
  std::optional<absl::Time> wait_until;
  grpc::Status started = Fill(StartSyncCall(*controller_, *req, *caller, &wait_until), resp);
  if (!started.ok() || !wait_until.has_value()) return Answer(ctx, started);
  return AwaitEnd(resp->sync_id(), *wait_until, resp->mutable_status());
}

grpc::ServerUnaryReactor* TrainerServiceImpl::AwaitEnd(const std::string& sync_id, absl::Time until,
                                                       v1::SyncStatus* out) {
  Controller* controller = controller_;
  return PolledUnary::Start(
      &controller_->waits(), until,
      [controller, sync_id, out](bool expired) -> std::optional<grpc::Status> {
        std::optional<absl::StatusOr<v1::SyncStatus>> end =
            PollSyncEnd(*controller, sync_id, expired);
        if (!end.has_value()) return std::nullopt;
        return Fill(*std::move(end), out);
      });
}

grpc::ServerUnaryReactor* TrainerServiceImpl::WaitSync(grpc::CallbackServerContext* ctx,
                                                       const v1::WaitSyncRequest* req,
                                                       v1::SyncStatus* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "WaitSync");
  if (!caller.ok()) return Answer(ctx, ToGrpc(caller.status()));
  return AwaitEnd(req->sync_id(), WaitSyncUntil(*controller_, *req), resp);
}

grpc::ServerWriteReactor<v1::SyncStatus>* TrainerServiceImpl::WatchSync(
    grpc::CallbackServerContext* ctx, const v1::WatchSyncRequest* req) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "WatchSync");
  if (!caller.ok()) return RefuseWatch(ToGrpc(caller.status()));
  Controller* controller = controller_;
  const std::string sync_id = req->sync_id();
  return PolledSyncWatch::Start(&controller_->waits(), [controller, sync_id](int64_t* seen) {
    return controller->syncs().NextSyncUpdate(sync_id, seen, absl::ZeroDuration());
  });
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
  return Fill(controller_->syncs().Cancel(req->sync_id(), req->reason(), AsTrainer(*caller)), resp);
}

grpc::Status TrainerServiceImpl::ListWorkers(grpc::ServerContext* ctx,
                                             const v1::ListWorkersRequest* req,
                                             v1::ListWorkersResponse* resp) {
  absl::StatusOr<Caller> caller = auth_->RequireRole(*ctx, Role::kReader, "ListWorkers");
  if (!caller.ok()) return ToGrpc(caller.status());
  const ControllerLimits& limits = controller_->limits();
  return ToGrpc(PageWorkers(controller_->ListWorkers(req->group()), *req, limits.list_page_workers,
                            limits.list_page_buffers, resp));
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
