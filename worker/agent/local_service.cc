#include "worker/agent/local_service.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/wire_text.h"

namespace wsync::agent {

Registrant LocalServiceImpl::Caller(const grpc::ServerContext& ctx) const {
  Registrant who;
  who.pid = -1;
  std::optional<PeerCred> cred = peers_ != nullptr ? peers_->Find(ctx.peer()) : std::nullopt;
  if (!cred.has_value()) return who;
  who.pid = cred->pid;
  who.admin = std::find(admin_uids_.begin(), admin_uids_.end(), cred->uid) != admin_uids_.end();
  return who;
}

grpc::Status LocalServiceImpl::RegisterTensors(grpc::ServerContext* ctx,
                                               const v1::RegisterTensorsRequest* req,
                                               v1::RegisterTensorsResponse* resp) {
  auto r = agent_->RegisterTensors(*req, Caller(*ctx));
  if (!r.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(r.status().code()),
                        ClipForWire(r.status().message()));
  }
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status LocalServiceImpl::SyncEvents(grpc::ServerContext* ctx, const v1::SyncEventsRequest*,
                                          grpc::ServerWriter<v1::SyncEvent>* writer) {
  const Registrant caller = Caller(*ctx);
  auto q = agent_->Subscribe(
      absl::StrCat("SyncEvents stream from ", ctx->peer(),
                   caller.pid >= 0 ? absl::StrCat(", pid ", caller.pid) : std::string()));
  writer->SendInitialMetadata();
  v1::SyncEvent e;
  while (!ctx->IsCancelled()) {
    if (!q->Pop(&e, absl::Milliseconds(100), /*read=*/false)) continue;
    if (!writer->Write(e)) break;
    q->MarkRead();  // handed to the stream (a staged report waits for it)
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
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), ClipForWire(s.message()));
}

}  // namespace wsync::agent
