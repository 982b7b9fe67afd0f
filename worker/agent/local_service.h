// The worker's local gRPC API (worker_local.proto) for the owner process,
// served on a Unix domain socket.
#ifndef WSYNC_WORKER_AGENT_LOCAL_SERVICE_H_
#define WSYNC_WORKER_AGENT_LOCAL_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "worker/agent/agent.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::agent {

class LocalServiceImpl final : public v1::WorkerLocal::Service {
 public:
  explicit LocalServiceImpl(WorkerAgent* agent) : agent_(agent) {}

  grpc::Status RegisterTensors(grpc::ServerContext*, const v1::RegisterTensorsRequest* req,
                               v1::RegisterTensorsResponse* resp) override;
  grpc::Status SyncEvents(grpc::ServerContext* ctx, const v1::SyncEventsRequest*,
                          grpc::ServerWriter<v1::SyncEvent>* writer) override;
  grpc::Status Status(grpc::ServerContext*, const v1::LocalStatusRequest*,
                      v1::LocalStatusResponse* resp) override;
  grpc::Status SetServing(grpc::ServerContext*, const v1::SetServingRequest* req,
                          v1::SetServingResponse* resp) override;

 private:
  WorkerAgent* const agent_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LOCAL_SERVICE_H_
