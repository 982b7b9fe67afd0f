#include "worker/agent/local_endpoint.h"

#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace wsync::agent {

std::unique_ptr<LocalEndpoint> LocalEndpoint::Open(std::string socket_path) {
  std::unique_ptr<LocalEndpoint> ep(new LocalEndpoint(std::move(socket_path)));
  FdInboxOptions options;
  options.path = FdSocketPath(ep->path_);
  auto inbox = FdInbox::Start(options);
  if (inbox.ok()) {
    ep->inbox_ = *std::move(inbox);
  } else {
    // Only CUDA virtual memory needs it: such registrations are then refused
    // by name ("no descriptor socket").
    spdlog::warn("worker: no descriptor socket beside {}: {}", ep->path_,
                 inbox.status().ToString());
  }
  return ep;
}

absl::Status LocalEndpoint::Serve(WorkerAgent* agent) {
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("already serving on ", path_));
  }
  service_ = std::make_unique<LocalServiceImpl>(agent);
  unlink(path_.c_str());  // a stale socket of an earlier run
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path_, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve the local API on ", path_));
  }
  return absl::OkStatus();
}

LocalEndpoint::~LocalEndpoint() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
    unlink(path_.c_str());
  }
  inbox_.reset();
}

}  // namespace wsync::agent
