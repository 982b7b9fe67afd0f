// gRPC adapters of the controller's state owners (controller.h): the worker
// and trainer services. Every handler first admits its caller (auth.h): a
// worker call names a lease bound to the caller's identity; a trainer call
// needs a role (docs/security.md). Quick calls are synchronous handlers; the
// calls that wait (KvGet with timeout_ms, AwaitWriters, Sync with wait_ms,
// WaitSync, WatchSync) are callback handlers whose waits the controller's
// WaitHub holds without a thread each (polled_reactors.h), and each worker's
// assignment stream is a callback reactor the registry wakes
// (assignment_stream.h); they admit their caller the same way and answer a
// refusal through the reactor.
#ifndef WSYNC_CONTROLLER_SERVER_SERVICES_H_
#define WSYNC_CONTROLLER_SERVER_SERVICES_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/server/auth.h"
#include "controller/server/controller.h"
#include "controller/server/polled_reactors.h"
#include "controller/server/worker_pages.h"
#include "grpcpp/grpcpp.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::controller {

using WorkerServiceBase =
    v1::WorkerService::WithCallbackMethod_KvGet<v1::WorkerService::WithCallbackMethod_AwaitWriters<
        v1::WorkerService::WithCallbackMethod_Assignments<
            v1::WorkerService::WithCallbackMethod_ReportResult<v1::WorkerService::Service>>>>;
using TrainerServiceBase =
    v1::TrainerService::WithCallbackMethod_Sync<v1::TrainerService::WithCallbackMethod_WaitSync<
        v1::TrainerService::WithCallbackMethod_WatchSync<v1::TrainerService::Service>>>;

class WorkerServiceImpl final : public WorkerServiceBase {
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
  grpc::ServerWriteReactor<v1::Assignment>* Assignments(grpc::CallbackServerContext* ctx,
                                                        const v1::AssignmentsRequest* req) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse* resp) override;
  // A callback handler: a sync's last report ends it on gRPC's own thread,
  // without a hand-off to the synchronous handlers' pool (measured: 0.07-0.12
  // ms less per sync after an idle spell, docs/performance-notes.md). It
  // blocks that thread only for the bounded work of ending a sync: one
  // in-place write of the state file, and with --state_fsync=always (or
  // while the background flusher holds the file being reused) an fdatasync.
  grpc::ServerUnaryReactor* ReportResult(grpc::CallbackServerContext* ctx,
                                         const v1::ReportResultRequest* req,
                                         v1::ReportResultResponse* resp) override;
  grpc::Status KvSet(grpc::ServerContext*, const v1::KvSetRequest* req,
                     v1::KvSetResponse* resp) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* req,
                                  v1::KvGetResponse* resp) override;
  grpc::ServerUnaryReactor* AwaitWriters(grpc::CallbackServerContext* ctx,
                                         const v1::AwaitWritersRequest* req,
                                         v1::AwaitWritersResponse* resp) override;

 private:
  // OK when the caller is a worker (mutual TLS, unless insecure) whose
  // identity holds `lease_id`.
  absl::Status Admit(const grpc::ServerContextBase& ctx, const std::string& lease_id,
                     absl::string_view method);

  Controller* const controller_;
  Authenticator* const auth_;
};

class TrainerServiceImpl final : public TrainerServiceBase {
 public:
  // Neither is owned; both outlive the service.
  TrainerServiceImpl(Controller* controller, Authenticator* auth)
      : controller_(controller), auth_(auth) {}

  grpc::Status DefineTransfer(grpc::ServerContext*, const v1::DefineTransferRequest* req,
                              v1::DefineTransferResponse* resp) override;
  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest* req,
                    v1::PlanResponse* resp) override;
  grpc::ServerUnaryReactor* Sync(grpc::CallbackServerContext* ctx, const v1::SyncRequest* req,
                                 v1::SyncResponse* resp) override;
  grpc::ServerUnaryReactor* WaitSync(grpc::CallbackServerContext* ctx,
                                     const v1::WaitSyncRequest* req, v1::SyncStatus* resp) override;
  grpc::ServerWriteReactor<v1::SyncStatus>* WatchSync(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchSyncRequest* req) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override;
  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest* req,
                      v1::SyncStatus* resp) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override;
  grpc::Status Replicas(grpc::ServerContext*, const v1::ReplicasRequest* req,
                        v1::ReplicasResponse* resp) override;

 private:
  // Answers with sync `sync_id`'s status (into *out) once it ended or
  // `until` passed.
  grpc::ServerUnaryReactor* AwaitEnd(const std::string& sync_id, absl::Time until,
                                     v1::SyncStatus* out);

  Controller* const controller_;
  Authenticator* const auth_;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_SERVICES_H_
