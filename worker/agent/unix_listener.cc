#include "worker/agent/unix_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace wsync::agent {
namespace {

constexpr int kAcceptBackoffMs = 100;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Start(UnixListenerOptions options,
                                                                  AcceptFn on_accept,
                                                                  TickFn on_tick) {
  sockaddr_un addr{};
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(options.what, " path '", options.path,
                                                   "' is empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::unique_ptr<UnixListener> l(
      new UnixListener(std::move(options), std::move(on_accept), std::move(on_tick)));
  if (absl::Status s = l->Listen(); !s.ok()) return s;
  l->thread_ = std::thread([p = l.get()] { p->Serve(); });
  return l;
}

absl::Status UnixListener::Listen() {
  const std::string& path = options_.path;
  const std::string& what = options_.what;
  listen_fd_ = socket(AF_UNIX, options_.type | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Errno(absl::StrCat(what, ": socket"));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ::unlink(path.c_str());  // a stale socket of an earlier run
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const absl::Status s = Errno(absl::StrCat(what, ": bind ", path));
    ::close(listen_fd_);
    listen_fd_ = -1;  // nothing bound: the destructor leaves the path alone
    return s;
  }
  if (options_.group.has_value() && chown(path.c_str(), static_cast<uid_t>(-1), *options_.group)) {
    return Errno(absl::StrCat(what, ": chgrp ", path, " to ", *options_.group));
  }
  // Before listen(): nobody connects while the mode is the umask's.
  if (chmod(path.c_str(), options_.mode) != 0) return Errno(absl::StrCat(what, ": chmod ", path));
  if (listen(listen_fd_, options_.backlog) != 0) return Errno(absl::StrCat(what, ": listen"));
  if (pipe2(wake_, O_CLOEXEC) != 0) return Errno(absl::StrCat(what, ": pipe"));
  return absl::OkStatus();
}

UnixListener::~UnixListener() {
  if (thread_.joinable()) {
    const char stop = 's';
    (void)!write(wake_[1], &stop, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  if (listen_fd_ >= 0) ::unlink(options_.path.c_str());
}

void UnixListener::Serve() {
  const int tick_ms = options_.tick == absl::InfiniteDuration()
                          ? -1
                          : static_cast<int>(std::clamp<int64_t>(
                                absl::ToInt64Milliseconds(options_.tick), 1, 24 * 3600 * 1000));
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, tick_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("{}: poll: {}", options_.what, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (on_tick_) on_tick_();
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      // E.g. out of open files: back off instead of spinning on poll().
      spdlog::warn("{}: accept: {}", options_.what, std::strerror(errno));
      pollfd wake = {wake_[0], POLLIN, 0};
      poll(&wake, 1, kAcceptBackoffMs);
      continue;
    }
    on_accept_(conn);
  }
}

}  // namespace wsync::agent
