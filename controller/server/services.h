// gRPC adapters of the controller's state owners (controller.h): the worker
// and trainer services. Every handler first admits its caller (auth.h): a
// worker call names a lease bound to the caller's identity; a trainer call
// needs a role (docs/security.md).
#ifndef WSYNC_CONTROLLER_SERVER_SERVICES_H_
#define WSYNC_CONTROLLER_SERVER_SERVICES_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/server/auth.h"
#include "controller/server/controller.h"
#include "grpcpp/grpcpp.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::controller {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  // Neither is owned; both outlive the service.
  WorkerServiceImpl(Controller* controller, Authenticator* auth)
      : controller_(controller), auth_(auth) {}

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status UpdateBuffers(grpc::ServerContext*, const v1::UpdateBuffersRequest* req,
                             v1::UpdateBuffersResponse* resp) override;
  grpc::Status Assignments(grpc::ServerContext* ctx, const v1::AssignmentsRequest* req,
                           grpc::ServerWriter<v1::Assignment>* writer) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse* resp) override;
  grpc::Status ReportResult(grpc::ServerContext*, const v1::ReportResultRequest* req,
                            v1::ReportResultResponse* resp) override;
  grpc::Status KvSet(grpc::ServerContext*, const v1::KvSetRequest* req,
                     v1::KvSetResponse* resp) override;
  grpc::Status KvGet(grpc::ServerContext*, const v1::KvGetRequest* req,
                     v1::KvGetResponse* resp) override;
  grpc::Status AwaitWriters(grpc::ServerContext*, const v1::AwaitWritersRequest* req,
                            v1::AwaitWritersResponse* resp) override;

 private:
  // OK when the caller is a worker (mutual TLS, unless insecure) whose
  // identity holds `lease_id`.
  absl::Status Admit(const grpc::ServerContext& ctx, const std::string& lease_id,
                     absl::string_view method);

  Controller* const controller_;
  Authenticator* const auth_;
};

class TrainerServiceImpl final : public v1::TrainerService::Service {
 public:
  // Neither is owned; both outlive the service.
  TrainerServiceImpl(Controller* controller, Authenticator* auth)
      : controller_(controller), auth_(auth) {}

  grpc::Status DefineTransfer(grpc::ServerContext*, const v1::DefineTransferRequest* req,
                              v1::DefineTransferResponse* resp) override;
  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest* req,
                    v1::PlanResponse* resp) override;
  grpc::Status Sync(grpc::ServerContext*, const v1::SyncRequest* req,
                    v1::SyncResponse* resp) override;
  grpc::Status WaitSync(grpc::ServerContext* ctx, const v1::WaitSyncRequest* req,
                        v1::SyncStatus* resp) override;
  grpc::Status WatchSync(grpc::ServerContext* ctx, const v1::WatchSyncRequest* req,
                         grpc::ServerWriter<v1::SyncStatus>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override;
  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest* req,
                      v1::SyncStatus* resp) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override;
  grpc::Status Replicas(grpc::ServerContext*, const v1::ReplicasRequest* req,
                        v1::ReplicasResponse* resp) override;

 private:
  // Sync `sync_id`'s status once it ended, `until` passed or the client left.
  grpc::Status AwaitEnd(grpc::ServerContext* ctx, const std::string& sync_id, absl::Time until,
                        v1::SyncStatus* out);

  Controller* const controller_;
  Authenticator* const auth_;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_SERVICES_H_
