// A listening Unix socket with its own accept thread, shared by the worker's
// local API socket (local_socket.h) and its descriptor socket (fd_inbox.h):
// bind (replacing a stale socket file), chgrp / chmod before listen() so that
// nobody connects while the mode is the umask's, a wake pipe that stops the
// thread, and teardown that removes the socket file. Admission (SO_PEERCRED)
// and the protocol stay with the user, in `on_accept`.
#ifndef WSYNC_WORKER_AGENT_UNIX_LISTENER_H_
#define WSYNC_WORKER_AGENT_UNIX_LISTENER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace wsync::agent {

struct UnixListenerOptions {
  std::string what;            // names the socket in errors and logs
  std::string path;            // the socket file; replaced if it exists
  int type = 0;                // SOCK_STREAM or SOCK_SEQPACKET
  mode_t mode = 0600;          // set before listen()
  std::optional<gid_t> group;  // chgrp'd to before the chmod
  int backlog = 64;
  // `on_tick` runs at least this often (and after every wake-up).
  absl::Duration tick = absl::InfiniteDuration();
};

class UnixListener {
 public:
  // Takes a connection (non-blocking, close-on-exec); the callee owns it.
  using AcceptFn = std::function<void(int conn)>;
  using TickFn = std::function<void()>;

  // Binds, sets group and mode, listens, then accepts on its own thread,
  // calling `on_accept` for each connection (one at a time) and `on_tick`
  // (may be null) every options.tick. INVALID_ARGUMENT for a path that is
  // empty or too long for sockaddr_un, UNAVAILABLE naming the failed call.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Start(UnixListenerOptions options,
                                                             AcceptFn on_accept,
                                                             TickFn on_tick = nullptr);
  // Stops the thread (waiting for a callback in progress), closes the
  // socket and removes its file.
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Readable once the listener is stopping: a callback that waits on its
  // connection polls it too, so that teardown never waits for a slow peer.
  int stop_fd() const { return wake_[0]; }
  const std::string& path() const { return options_.path; }

 private:
  UnixListener(UnixListenerOptions options, AcceptFn on_accept, TickFn on_tick)
      : options_(std::move(options)),
        on_accept_(std::move(on_accept)),
        on_tick_(std::move(on_tick)) {}
  absl::Status Listen();
  void Serve();

  const UnixListenerOptions options_;
  const AcceptFn on_accept_;
  const TickFn on_tick_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_UNIX_LISTENER_H_
