// LaneServer: the socket, the thread and the connections' I/O. The calls
// themselves: lane_calls.cc.
#include "controller/server/lane_server.h"

#include <errno.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/wire_text.h"

namespace wsync::controller {
namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr size_t kReadChunk = 64 << 10;
constexpr int kReadsPerEvent = 16;  // then other connections get their turn
// A connection's buffer larger than this is shrunk once mostly empty.
constexpr size_t kKeepBufferBytes = 1 << 20;
constexpr absl::Duration kMinAcceptBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxAcceptBackoff = absl::Seconds(1);

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("--lane_socket ", path, ": ", what, ": ", std::strerror(errno)));
}

bool FillAddress(const std::string& path, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

}  // namespace

LaneServer::LaneServer(LaneOptions options, Controller* controller, Authenticator* auth)
    : options_(std::move(options)),
      controller_(controller),
      auth_(auth),
      busy_(options_.busy_poll) {}

absl::StatusOr<std::unique_ptr<LaneServer>> LaneServer::Start(LaneOptions options,
                                                              Controller* controller,
                                                              Authenticator* auth) {
  std::unique_ptr<LaneServer> s(new LaneServer(std::move(options), controller, auth));
  if (absl::Status st = s->Bind(); !st.ok()) return st;
  LaneServer* self = s.get();
  std::shared_ptr<LaneWake> wake = s->self_;
  controller->SetChangeObserver([wake] { wake->Notify(); });
  s->thread_ = std::thread([self] { self->Run(); });
  pthread_setname_np(s->thread_.native_handle(), "wsync-lane");
  spdlog::info("[controller] control fast lane on {} (mode 0600{})", s->path(),
               s->busy_.enabled() ? ", spinning per --busy_poll_ms" : "");
  return s;
}

absl::Status LaneServer::RemoveDeadSocket(const std::string& path, const sockaddr_un& addr) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("lstat", path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lane_socket ", path, " exists and is not a socket; not replacing it"));
  }
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat("--lane_socket ", path, " is a socket of uid ",
                                                    st.st_uid, ", not this controller's (uid ",
                                                    geteuid(), "); not replacing it"));
  }
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return Errno("socket (probing the existing socket)", path);
  const int rc = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int connect_errno = errno;
  close(probe);
  if (rc == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("--lane_socket ", path, ": another process listens there"));
  }
  if (connect_errno == ENOENT) return absl::OkStatus();  // gone meanwhile
  if (connect_errno != ECONNREFUSED) {                   // not provably dead: leave it
    errno = connect_errno;
    return Errno("probing the existing socket (not replacing it)", path);
  }
  // A dead controller's socket; only if it is still the file looked at.
  struct stat again;
  if (lstat(path.c_str(), &again) == 0 && again.st_dev == st.st_dev && again.st_ino == st.st_ino &&
      unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Errno("unlink (a dead socket)", path);
  }
  return absl::OkStatus();
}

absl::Status LaneServer::Bind() {
  const std::string& path = options_.socket_path;
  sockaddr_un addr;
  if (!FillAddress(path, &addr)) {
    return absl::InvalidArgumentError(absl::StrCat("--lane_socket '", path, "' must have 1 to ",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  RETURN_IF_ERROR(RemoveDeadSocket(path, addr));
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Errno("socket", path);
  // The umask is left alone (it is the whole process's, and other threads
  // may be creating files): the mode is set to 0600 below, before listen(),
  // and until listen() every connect is refused anyway.
  if (bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind", path);
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return Errno("lstat after bind", path);
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("lane socket ", path, ": not a socket right after bind (replaced?)"));
  }
  bound_ = true;  // the socket file is ours: the destructor removes it, if still ours
  bound_dev_ = st.st_dev;
  bound_ino_ = st.st_ino;
  // Owner only before anyone can connect; SO_PEERCRED checks each peer too.
  if (chmod(path.c_str(), 0600) != 0) return Errno("chmod 0600", path);
  if (listen(listen_fd_, 128) != 0) return Errno("listen", path);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Errno("epoll_create1", path);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Errno("eventfd", path);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) return Errno("epoll_ctl", path);
  ev.data.u64 = kWakeId;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return Errno("epoll_ctl", path);
  return absl::OkStatus();
}

void LaneWake::Notify() {
  absl::MutexLock lock(&mu_);
  if (server_ != nullptr) server_->Notify();
}

void LaneWake::Detach() {
  absl::MutexLock lock(&mu_);
  server_ = nullptr;
}

LaneServer::~LaneServer() {
  Shutdown();
  self_->Detach();  // no Notify runs or starts after this: the eventfd may close
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
    if (fd >= 0) close(fd);
  }
  // Only the socket this server created: a file another process put at the
  // path since (a newer controller's socket) stays.
  struct stat st;
  if (bound_ && lstat(options_.socket_path.c_str(), &st) == 0 && st.st_dev == bound_dev_ &&
      st.st_ino == bound_ino_) {
    unlink(options_.socket_path.c_str());
  }
}

void LaneServer::Notify() {
  notified_.store(true);
  if (sleeping_.load()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
}

void LaneServer::Shutdown() {
  if (stop_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

void LaneServer::Run() {
  while (!stop_.load()) Round(busy_.enabled() && busy_.Spinning());
  // Each wait gets an answer (its sync's status as it stands), then every
  // connection closes.
  PollWaits(/*all_expired=*/true);
  for (auto& [id, c] : conns_) Close(id);  // open streams end as on gRPC
  conns_.clear();
}

int LaneServer::SleepMs() const {
  absl::Duration sleep = absl::Seconds(1);
  const absl::Time now = absl::Now();
  for (const Wait& w : waits_) sleep = std::min(sleep, w.until - now);
  sleep = std::min(sleep, accept_resume_ - now);
  if (sleep <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(sleep)) + 1;  // not before it is due
}

void LaneServer::Round(bool spin) {
  epoll_event events[64];
  int timeout = 0;
  if (!spin) {
    timeout = SleepMs();
    sleeping_.store(true);
    if (notified_.load() || stop_.load()) timeout = 0;
  }
  const int n = epoll_wait(epoll_fd_, events, 64, timeout);
  sleeping_.store(false);
  for (int i = 0; i < n; ++i) {
    const uint64_t id = events[i].data.u64;
    if (id == kListenerId) {
      Accept();
    } else if (id == kWakeId) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &count, sizeof(count));
    } else if (auto it = conns_.find(id); it != conns_.end() && it->second->fd >= 0) {
      Conn& c = *it->second;
      if (events[i].events & EPOLLOUT) OnWritable(c);
      if (c.fd >= 0 && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        OnReadable(c);
      }
    }
  }
  ResumeAcceptsIfDue();
  const bool notified = notified_.load();
  PollIfNotified();
  PollDueWaits();
  if (closed_any_) {  // connections closed this round go now, their waits with them
    closed_any_ = false;
    waits_.erase(std::remove_if(waits_.begin(), waits_.end(),
                                [this](const Wait& w) {
                                  auto it = conns_.find(w.conn);
                                  return it == conns_.end() || it->second->fd < 0;
                                }),
                 waits_.end());
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (it->second->fd < 0) conns_.erase(it);
      it = next;
    }
  }
  if (n > 0 || notified) {
    busy_.Touch();
  } else if (spin) {
    BusyPoll::Relax();
  }
}

void LaneServer::Accept() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      // A connection that went away while queued: the next one may be fine.
      if (e == ECONNABORTED || e == EPROTO) continue;
      if (e != EAGAIN && e != EWOULDBLOCK) PauseAccepts(e);
      return;
    }
    if (accept_backoff_ > absl::ZeroDuration()) {
      spdlog::info("[controller] lane {}: accepting connections again", path());
      accept_backoff_ = absl::ZeroDuration();
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = next_conn_++;
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 ||
        (peer.uid != geteuid() && peer.uid != 0)) {
      Refuse(*c, absl::PermissionDeniedError(absl::StrCat(
                     "lane: only the controller's user (uid ", geteuid(),
                     ") or root may connect; peer uid ", peer.uid, ", pid ", peer.pid)));
      continue;
    }
    if (static_cast<int>(conns_.size()) >= options_.max_connections) {
      Refuse(*c, absl::ResourceExhaustedError(
                     absl::StrCat("lane: ", conns_.size(),
                                  " connections already (the most the controller "
                                  "takes); use gRPC")));
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      spdlog::warn("[controller] lane {}: epoll_ctl: {}", path(), std::strerror(errno));
      close(fd);
      continue;
    }
    conns_.emplace(c->id, std::move(c));
  }
}

void LaneServer::PauseAccepts(int e) {
  // The listener stays readable while the connection waits in the backlog:
  // out of descriptors (EMFILE, ENFILE) or memory, accepting again at once
  // would spin. Off epoll until the backoff ends; one warning per episode.
  if (accept_backoff_ == absl::ZeroDuration()) {
    spdlog::warn(
        "[controller] lane {}: accept: {}; not accepting for a while (retried with backoff "
        "up to {}; connections wait in the backlog)",
        path(), std::strerror(e), absl::FormatDuration(kMaxAcceptBackoff));
    accept_backoff_ = kMinAcceptBackoff;
  } else {
    accept_backoff_ = std::min(accept_backoff_ * 2, kMaxAcceptBackoff);
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  accept_resume_ = absl::Now() + accept_backoff_;
}

void LaneServer::ResumeAcceptsIfDue() {
  if (accept_resume_ == absl::InfiniteFuture() || absl::Now() < accept_resume_) return;
  accept_resume_ = absl::InfiniteFuture();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
    spdlog::warn("[controller] lane {}: epoll_ctl (listener): {}", path(), std::strerror(errno));
  }
  Accept();
}

void LaneServer::OnReadable(Conn& c) {
  char chunk[kReadChunk];
  for (int i = 0; i < kReadsPerEvent && c.fd >= 0; ++i) {
    const ssize_t n = recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      c.in.append(chunk, static_cast<size_t>(n));
      if (!RunFrames(c)) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Close(c.id);  // end of stream or an error: the peer is gone
    return;
  }
}

bool LaneServer::RunFrames(Conn& c) {
  size_t at = 0;
  while (c.fd >= 0) {
    absl::StatusOr<LaneFrame> frame =
        NextLaneFrame(absl::string_view(c.in).substr(at), options_.max_frame_bytes);
    if (!frame.ok()) {
      Refuse(c, frame.status());
      return false;
    }
    if (frame->consumed == 0) break;
    v1::LaneRequest req;
    if (absl::Status st = ParseLanePayload(frame->payload, "LaneRequest", &req); !st.ok()) {
      Refuse(c, st);
      return false;
    }
    at += frame->consumed;
    Dispatch(c, req);
  }
  if (c.fd < 0) return false;
  c.in.erase(0, at);
  Trim(c);
  return true;
}

void LaneServer::Trim(Conn& c) {
  // A large frame grew a buffer: give the memory back once it is no longer
  // needed (what is left is moved to a buffer of its size).
  for (std::string* b : {&c.in, &c.out}) {
    if (b->capacity() > kKeepBufferBytes && b->size() <= kKeepBufferBytes / 2) {
      std::string(*b).swap(*b);
    }
  }
  const size_t held = c.fd >= 0 ? c.in.capacity() + c.out.capacity() : 0;
  buffer_bytes_.fetch_add(held - c.held);  // modulo 2^64: a decrease too
  c.held = held;
}

void LaneServer::OnWritable(Conn& c) { Flush(c); }

bool LaneServer::Send(uint64_t conn, const v1::LaneResponse& resp) {
  auto it = conns_.find(conn);
  return it != conns_.end() && Send(*it->second, resp);
}

bool LaneServer::Send(Conn& c, const v1::LaneResponse& resp) {
  if (c.fd < 0) return false;
  if (absl::Status st = AppendLaneFrame(resp, options_.max_response_bytes, &c.out); !st.ok()) {
    v1::LaneResponse too_big;
    too_big.set_call_id(resp.call_id());
    too_big.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
    too_big.set_message(std::string(st.message()));
    (void)AppendLaneFrame(too_big, options_.max_response_bytes, &c.out);
  }
  if (c.out.size() - c.out_at > options_.max_pending_bytes) {
    spdlog::warn(
        "[controller] lane {}: dropping a peer that does not read its answers ({} "
        "bytes unsent)",
        path(), c.out.size() - c.out_at);
    Close(c.id);
    return false;
  }
  return Flush(c);
}

bool LaneServer::Flush(Conn& c) {
  while (c.fd >= 0 && c.out_at < c.out.size()) {
    const ssize_t n =
        send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_at += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c.want_write) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
        ev.data.u64 = c.id;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
        c.want_write = true;
      }
      if (c.out_at > kReadChunk) {
        c.out.erase(0, c.out_at);
        c.out_at = 0;
      }
      Trim(c);
      return true;
    }
    Close(c.id);  // the peer is gone
    return false;
  }
  if (c.fd < 0) return false;
  c.out.clear();
  c.out_at = 0;
  Trim(c);
  if (c.want_write) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c.id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    c.want_write = false;
  }
  return true;
}

void LaneServer::Refuse(Conn& c, const absl::Status& status) {
  spdlog::warn("[controller] lane {}: closing a connection: {}", path(),
               ClipForWire(status.ToString()));
  v1::LaneResponse resp;
  resp.set_code(static_cast<int>(status.code()));
  resp.set_message(ClipForWire(status.message()));
  std::string frame;
  if (AppendLaneFrame(resp, options_.max_response_bytes, &frame).ok()) {
    [[maybe_unused]] ssize_t n =
        send(c.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort
  }
  if (conns_.contains(c.id)) {
    Close(c.id);
  } else {
    close(c.fd);  // refused at accept
    c.fd = -1;
  }
}

void LaneServer::Close(uint64_t conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end() || it->second->fd < 0) return;
  Conn& c = *it->second;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  c.fd = -1;  // erased at the end of the round, with its waits
  closed_any_ = true;
  Trim(c);  // no longer counted
  // As a gRPC stream that ends: the lease ends. This thread holds no
  // controller lock here.
  if (c.feed != nullptr) c.feed->Close("lane connection closed");
}

}  // namespace wsync::controller
