// The worker's descriptor socket: an owner process hands it file
// descriptors (SCM_RIGHTS over a Unix SOCK_SEQPACKET socket), e.g. the POSIX
// handles of its CUDA virtual-memory allocations, which gRPC cannot carry.
// Each connection delivers one batch and gets a token back; a later
// RegisterTensors names the token (CudaVmm.fd_token) and the agent Claims the
// batch. Unclaimed batches are closed after `ttl`.
//
// Protocol (one connection, messages keep their boundaries):
//   owner -> "WSFD" with 1..kMaxFdsPerMessage descriptors attached   (repeated)
//   owner -> "DONE"
//   inbox -> "OK <token>"  or  "ERR <message>"
// Only processes of the worker's own user (or root) are served (SO_PEERCRED):
// descriptors grant access to memory. One connection is served at a time and
// must deliver its whole batch within `io_timeout`; stopping the inbox ends a
// connection in progress. Expired batches are closed within ttl / 4 (at most
// a second) whether or not anything else happens. The socket file is mode
// 0600.
#ifndef WSYNC_WORKER_AGENT_FD_INBOX_H_
#define WSYNC_WORKER_AGENT_FD_INBOX_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/agent/unix_listener.h"
#include "worker/plane/fd_batch.h"

namespace wsync::agent {

struct FdInboxOptions {
  std::string path;  // socket file; replaced if it exists
  absl::Duration ttl = absl::Minutes(1);
  absl::Duration io_timeout = absl::Seconds(10);  // per connection, whole batch
  int32_t max_fds_per_batch = 16384;
  int32_t max_fds_pending = 32768;  // over all unclaimed batches
};

inline constexpr int32_t kMaxFdsPerMessage = 250;  // below the kernel's SCM_MAX_FD (253)

class FdInbox {
 public:
  // Binds and listens, then serves on its own thread.
  static absl::StatusOr<std::unique_ptr<FdInbox>> Start(FdInboxOptions options);
  ~FdInbox();  // stops serving, removes the socket file, closes unclaimed batches
  FdInbox(const FdInbox&) = delete;
  FdInbox& operator=(const FdInbox&) = delete;

  // Takes the batch `token` names (each batch is claimed once). NOT_FOUND
  // (naming `what`) for an unknown, claimed or expired token.
  absl::StatusOr<std::shared_ptr<const plane::FdBatch>> Claim(const std::string& token,
                                                              const std::string& what);
  const std::string& path() const { return options_.path; }
  int32_t pending_fds() const;

 private:
  struct Pending {
    std::shared_ptr<const plane::FdBatch> batch;
    absl::Time created;
  };
  explicit FdInbox(FdInboxOptions options) : options_(std::move(options)) {}
  void HandleConnection(int conn);
  // Receives one connection's batch (descriptors owned by `out` as they come).
  absl::Status ReceiveBatch(int conn, std::vector<int>* out);
  absl::StatusOr<std::string> Admit(std::vector<int> fds);
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FdInboxOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  int32_t pending_fds_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<UnixListener> listener_;  // last: its thread uses the members above
};

// The descriptor socket beside a local API socket: "<local_socket>.fds".
std::string FdSocketPath(const std::string& local_socket);

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_FD_INBOX_H_
