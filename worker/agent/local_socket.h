// The worker's local socket: where its owner process reaches the local API
// (worker_local.proto) and, beside it, the descriptor socket (fd_inbox.h).
//
// Both live in a private directory: the worker creates it 0700 (or 0710 for
// a configured group), and refuses an existing one that is not a directory
// of its own user, or that its group or others may write (they could swap
// the socket). The socket is mode 0600 (0660 with the group). Its accept
// loop is the worker's: a connection whose peer (SO_PEERCRED) is neither the
// worker's user, nor a listed uid, nor of the configured group is closed;
// an admitted one is handed to gRPC (AddInsecureChannelFromFd), and its
// peer's credentials stay known to the handlers by the connection's gRPC
// peer string ("fd:<n>").
#ifndef WSYNC_WORKER_AGENT_LOCAL_SOCKET_H_
#define WSYNC_WORKER_AGENT_LOCAL_SOCKET_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent/unix_listener.h"

namespace wsync::agent {

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The credentials of admitted connections, by gRPC peer string.
class PeerDirectory {
 public:
  void Set(int fd, const PeerCred& cred);
  // Null for a peer string of no admitted connection.
  std::optional<PeerCred> Find(const std::string& grpc_peer) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, PeerCred> by_fd_ ABSL_GUARDED_BY(mu_);
};

struct LocalSocketOptions {
  std::string path;                 // the socket file
  std::optional<gid_t> group;       // --local_socket_group: 0660 and that group's peers
  std::vector<uid_t> allowed_uids;  // --local_allowed_uids, besides the worker's own
};

// "$XDG_RUNTIME_DIR/wsync" when that variable is set, else "/tmp/wsync-<uid>".
std::string DefaultSocketDir();
// "<DefaultSocketDir()>/worker-<group>-<rank>.sock" (python/wsync finds it there too).
std::string DefaultSocketPath(const std::string& group, int32_t rank);
// The worker's flags: --local_socket ("" for the default), --local_socket_group
// (a group name or gid, "" for none), --local_allowed_uids (comma-separated).
absl::StatusOr<LocalSocketOptions> ResolveLocalSocket(const std::string& path,
                                                      const std::string& group,
                                                      const std::string& allowed_uids,
                                                      const std::string& first_group, int32_t rank);
// Comma-separated uids (--local_allowed_uids, --local_admin_uids); `flag` names the flag in errors.
absl::StatusOr<std::vector<uid_t>> ParseUids(const std::string& text, const std::string& flag);
// Creates `dir` (mode 0700, or 0710 and `group`) when missing; then checks
// it: a directory (not a link) owned by this user that neither its group
// nor others may write. FAILED_PRECONDITION naming the path, its owner and
// mode otherwise.
absl::Status EnsurePrivateDir(const std::string& dir, std::optional<gid_t> group = std::nullopt);

class LocalSocket {
 public:
  // Checks (and for the default, creates) the socket's directory, binds and
  // listens; serves `server`'s services on its own accept thread.
  static absl::StatusOr<std::unique_ptr<LocalSocket>> Start(LocalSocketOptions options,
                                                            grpc::Server* server,
                                                            PeerDirectory* peers);
  ~LocalSocket();  // stops accepting, removes the socket file
  LocalSocket(const LocalSocket&) = delete;
  LocalSocket& operator=(const LocalSocket&) = delete;

  // Whether `cred` may connect.
  static bool Allowed(const LocalSocketOptions& options, const PeerCred& cred);

 private:
  LocalSocket(LocalSocketOptions options, grpc::Server* server, PeerDirectory* peers)
      : options_(std::move(options)), server_(server), peers_(peers) {}
  // The SO_PEERCRED admission of one connection (closed if refused).
  void Admit(int conn);

  const LocalSocketOptions options_;
  grpc::Server* const server_;
  PeerDirectory* const peers_;
  std::unique_ptr<UnixListener> listener_;  // last: its thread calls Admit
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LOCAL_SOCKET_H_
