#include "worker/agent/local_endpoint.h"

#include <chrono>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace wsync::agent {

absl::StatusOr<std::unique_ptr<LocalEndpoint>> LocalEndpoint::Open(LocalSocketOptions options) {
  // The directory first: the descriptor socket lives there too.
  const std::string dir = std::filesystem::path(options.path).parent_path().string();
  if (absl::Status s = EnsurePrivateDir(dir, options.group); !s.ok()) return s;
  std::unique_ptr<LocalEndpoint> ep(new LocalEndpoint(std::move(options)));
  FdInboxOptions inbox;
  inbox.path = FdSocketPath(ep->options_.path);
  auto started = FdInbox::Start(inbox);
  if (started.ok()) {
    ep->inbox_ = *std::move(started);
  } else {
    spdlog::warn("worker: no descriptor socket beside {}: {}", ep->options_.path,
                 started.status().ToString());
  }
  return ep;
}

absl::Status LocalEndpoint::Serve(WorkerAgent* agent, std::vector<uid_t> admin_uids) {
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("already serving on ", options_.path));
  }
  service_ = std::make_unique<LocalServiceImpl>(agent, &peers_, std::move(admin_uids));
  // No listening port: the local socket's own accept loop admits each
  // connection (SO_PEERCRED) and hands it to this server.
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot serve the local API on ", options_.path, ": no gRPC server"));
  }
  auto listener = LocalSocket::Start(options_, server_.get(), &peers_);
  if (!listener.ok()) {
    StopServing();
    return absl::Status(listener.status().code(),
                        absl::StrCat("cannot serve the local API on ", options_.path, ": ",
                                     listener.status().message()));
  }
  listener_ = *std::move(listener);
  return absl::OkStatus();
}

void LocalEndpoint::StopServing() {
  listener_.reset();  // no new connections, socket file removed
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  server_.reset();
  service_.reset();
}

LocalEndpoint::~LocalEndpoint() {
  StopServing();
  inbox_.reset();
}

}  // namespace wsync::agent
