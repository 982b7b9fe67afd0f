#include "worker/agent/local_service.h"

namespace wsync::agent {

grpc::Status LocalServiceImpl::RegisterTensors(grpc::ServerContext*,
                                               const v1::RegisterTensorsRequest* req,
                                               v1::RegisterTensorsResponse* resp) {
  auto r = agent_->RegisterTensors(*req);
  if (!r.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(r.status().code()),
                        std::string(r.status().message()));
  }
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status LocalServiceImpl::SyncEvents(grpc::ServerContext* ctx, const v1::SyncEventsRequest*,
                                          grpc::ServerWriter<v1::SyncEvent>* writer) {
  auto q = agent_->Subscribe();
  writer->SendInitialMetadata();
  v1::SyncEvent e;
  while (!ctx->IsCancelled()) {
    if (!q->Pop(&e, absl::Milliseconds(100))) continue;
    if (!writer->Write(e)) break;
  }
  agent_->Unsubscribe(q);
  return grpc::Status::OK;
}

grpc::Status LocalServiceImpl::Status(grpc::ServerContext*, const v1::LocalStatusRequest*,
                                      v1::LocalStatusResponse* resp) {
  *resp = agent_->Status();
  return grpc::Status::OK;
}

grpc::Status LocalServiceImpl::SetServing(grpc::ServerContext*, const v1::SetServingRequest* req,
                                          v1::SetServingResponse*) {
  const absl::Status s = agent_->SetServing(*req);
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace wsync::agent
