// A worker's local API (worker_local.proto: RegisterTensors, SyncEvents,
// Status, SetServing) on its private Unix socket (local_socket.h: private
// directory, modes, SO_PEERCRED admission) with, beside it, the descriptor
// socket (FdInbox, `<socket>.fds`) through which owners hand over CUDA
// virtual-memory allocations. wsync-worker serves one; an embedded worker
// serves one when asked, so that other processes on its GPU (a colocated
// trainer) register their tensors with it.
//
// Two steps, because the agent takes the inbox at construction:
//   auto ep = LocalEndpoint::Open(socket_options);  // directory + descriptor socket
//   options.fd_inbox = (*ep)->fd_inbox();           // null if it could not be made
//   WorkerAgent agent(options, ...);
//   (*ep)->Serve(&agent, admin_uids);               // the gRPC socket
// The destructor stops both and removes the socket files. Not thread-safe.
#ifndef WSYNC_WORKER_AGENT_LOCAL_ENDPOINT_H_
#define WSYNC_WORKER_AGENT_LOCAL_ENDPOINT_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/agent/agent.h"
#include "worker/agent/fd_inbox.h"
#include "worker/agent/local_service.h"
#include "worker/agent/local_socket.h"

namespace grpc {
class Server;
}

namespace wsync::agent {

class LocalEndpoint {
 public:
  // Makes (or checks) the socket's private directory, then starts the
  // descriptor socket in it. Errors name the directory; a descriptor socket
  // that cannot start is only logged (CUDA virtual-memory registrations are
  // then refused by name).
  static absl::StatusOr<std::unique_ptr<LocalEndpoint>> Open(LocalSocketOptions options);
  ~LocalEndpoint();

  LocalEndpoint(const LocalEndpoint&) = delete;
  LocalEndpoint& operator=(const LocalEndpoint&) = delete;

  FdInbox* fd_inbox() const { return inbox_.get(); }
  const std::string& path() const { return options_.path; }

  // Serves `agent`'s local API on the socket; `admin_uids` may replace any
  // registered tensor (LocalServiceImpl). UNAVAILABLE naming the path when it
  // cannot listen; FAILED_PRECONDITION when already serving. `agent` must
  // outlive this endpoint.
  absl::Status Serve(WorkerAgent* agent, std::vector<uid_t> admin_uids = {});
  // Stops accepting and ends the calls in progress (within a second), so
  // that no request reaches the agent afterwards. Idempotent.
  void StopServing();

 private:
  explicit LocalEndpoint(LocalSocketOptions options) : options_(std::move(options)) {}

  const LocalSocketOptions options_;
  std::unique_ptr<FdInbox> inbox_;
  PeerDirectory peers_;
  std::unique_ptr<LocalServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<LocalSocket> listener_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LOCAL_ENDPOINT_H_
