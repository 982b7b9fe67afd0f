// A worker's local API on a Unix socket (worker_local.proto: RegisterTensors,
// SyncEvents, Status, SetServing) with, beside it, the descriptor socket
// (FdInbox, `<socket>.fds`) through which owners hand over CUDA
// virtual-memory allocations. wsync-worker serves one; an embedded worker
// serves one when asked, so that other processes on its GPU (a colocated
// trainer) register their tensors with it.
//
// Two steps, because the agent takes the inbox at construction:
//   auto ep = LocalEndpoint::Open(path);   // the descriptor socket
//   options.fd_inbox = ep->fd_inbox();     // null if it could not be made
//   WorkerAgent agent(options, ...);
//   ep->Serve(&agent);                     // the gRPC socket
// The destructor stops both and removes the socket files. Not thread-safe.
#ifndef WSYNC_WORKER_AGENT_LOCAL_ENDPOINT_H_
#define WSYNC_WORKER_AGENT_LOCAL_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/agent/agent.h"
#include "worker/agent/fd_inbox.h"
#include "worker/agent/local_service.h"

namespace grpc {
class Server;
}

namespace wsync::agent {

class LocalEndpoint {
 public:
  // Starts the descriptor socket beside `socket_path`. Never fails: without
  // it only CUDA virtual-memory registrations are refused, by name, and the
  // reason is logged.
  static std::unique_ptr<LocalEndpoint> Open(std::string socket_path);
  ~LocalEndpoint();

  LocalEndpoint(const LocalEndpoint&) = delete;
  LocalEndpoint& operator=(const LocalEndpoint&) = delete;

  FdInbox* fd_inbox() const { return inbox_.get(); }
  const std::string& path() const { return path_; }

  // Serves `agent`'s local API on the socket (a stale socket file of an
  // earlier run is replaced). UNAVAILABLE naming the path when it cannot
  // bind; FAILED_PRECONDITION when already serving. `agent` must outlive
  // this endpoint.
  absl::Status Serve(WorkerAgent* agent);

 private:
  explicit LocalEndpoint(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  std::unique_ptr<FdInbox> inbox_;
  std::unique_ptr<LocalServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LOCAL_ENDPOINT_H_
