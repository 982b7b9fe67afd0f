// The worker's local gRPC API (worker_local.proto) for the owner process,
// served on a Unix domain socket (local_socket.h).
#ifndef WSYNC_WORKER_AGENT_LOCAL_SERVICE_H_
#define WSYNC_WORKER_AGENT_LOCAL_SERVICE_H_

#include <sys/types.h>

#include <vector>

#include "grpcpp/grpcpp.h"
#include "worker/agent/agent.h"
#include "worker/agent/local_socket.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::agent {

class LocalServiceImpl final : public v1::WorkerLocal::Service {
 public:
  // `peers` (may be null: every caller is unknown) names the process behind
  // each call for the replace rule (TensorTable::Register); callers of
  // `admin_uids` (--local_admin_uids) may replace any registration.
  explicit LocalServiceImpl(WorkerAgent* agent, const PeerDirectory* peers = nullptr,
                            std::vector<uid_t> admin_uids = {})
      : agent_(agent), peers_(peers), admin_uids_(std::move(admin_uids)) {}

  grpc::Status RegisterTensors(grpc::ServerContext*, const v1::RegisterTensorsRequest* req,
                               v1::RegisterTensorsResponse* resp) override;
  grpc::Status SyncEvents(grpc::ServerContext* ctx, const v1::SyncEventsRequest*,
                          grpc::ServerWriter<v1::SyncEvent>* writer) override;
  grpc::Status Status(grpc::ServerContext*, const v1::LocalStatusRequest*,
                      v1::LocalStatusResponse* resp) override;
  grpc::Status SetServing(grpc::ServerContext*, const v1::SetServingRequest* req,
                          v1::SetServingResponse* resp) override;

 private:
  // Who is calling: its pid (-1 when unknown) and whether it is an admin.
  Registrant Caller(const grpc::ServerContext& ctx) const;

  WorkerAgent* const agent_;
  const PeerDirectory* const peers_;
  const std::vector<uid_t> admin_uids_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LOCAL_SERVICE_H_
