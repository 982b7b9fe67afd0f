#include "worker/agent/fd_inbox.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/agent/unix_listener.h"

namespace wsync::agent {
namespace {

constexpr char kFdsTag[] = "WSFD";
constexpr char kDoneTag[] = "DONE";
constexpr size_t kTagBytes = 4;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
}

absl::StatusOr<std::string> NewToken() {
  unsigned char raw[16];
  if (getrandom(raw, sizeof(raw), 0) != static_cast<ssize_t>(sizeof(raw))) {
    return Errno("descriptor socket: getrandom");
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
}

// Whether the connected peer runs as this process's user or as root.
absl::Status CheckPeer(int conn) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Errno("descriptor socket: SO_PEERCRED");
  }
  if (cred.uid != 0 && cred.uid != geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("descriptor socket: peer pid ", cred.pid, " runs as uid ", cred.uid,
                     ", this worker as uid ", geteuid(), " (only the same user or root)"));
  }
  return absl::OkStatus();
}

// Waits until `conn` is readable, `deadline` passes or `wake` (the inbox's
// stop pipe) is readable.
absl::Status AwaitReadable(int conn, int wake, absl::Time deadline) {
  for (;;) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      return absl::DeadlineExceededError(
          "descriptor socket: the owner did not send its whole batch in time");
    }
    pollfd fds[2] = {{conn, POLLIN, 0}, {wake, POLLIN, 0}};
    const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (n < 0 && errno != EINTR) return Errno("descriptor socket: poll");
    if (n > 0 && fds[1].revents != 0) {
      return absl::CancelledError("descriptor socket: the worker is stopping");
    }
    if (n > 0 && fds[0].revents != 0) return absl::OkStatus();
  }
}

// One message: its tag bytes and the descriptors attached (appended to *fds).
absl::StatusOr<std::string> ReceiveMessage(int conn, std::vector<int>* fds) {
  char data[16];
  iovec iov{data, sizeof(data)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return Errno("descriptor socket: recvmsg");
  if (n == 0) return absl::UnavailableError("descriptor socket: the owner hung up before DONE");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    // The descriptors' bytes, never negative (an unsigned wrap would read
    // past the control buffer).
    if (c->cmsg_len < CMSG_LEN(0)) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < count; ++i) fds->push_back(in[i]);
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("descriptor socket: descriptors were dropped: more than ", kMaxFdsPerMessage,
                     " in one message, or this worker ran out of open files (RLIMIT_NOFILE)"));
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return absl::InvalidArgumentError("descriptor socket: a message longer than its tag");
  }
  return std::string(data, static_cast<size_t>(n));
}

void Reply(int conn, const std::string& text) {
  if (send(conn, text.data(), text.size(), MSG_NOSIGNAL) < 0) {
    spdlog::warn("descriptor socket: cannot answer the owner: {}", std::strerror(errno));
  }
}

}  // namespace

std::string FdSocketPath(const std::string& local_socket) {
  return absl::StrCat(local_socket, ".fds");
}

absl::StatusOr<std::unique_ptr<FdInbox>> FdInbox::Start(FdInboxOptions options) {
  std::unique_ptr<FdInbox> inbox(new FdInbox(std::move(options)));
  UnixListenerOptions lo;
  lo.what = "descriptor socket";
  lo.path = inbox->options_.path;
  lo.type = SOCK_SEQPACKET;
  lo.mode = 0600;
  lo.backlog = 16;
  // Wakes at least every ttl / 4 (at most 1 s) to close expired batches.
  lo.tick = std::clamp(inbox->options_.ttl / 4, absl::Milliseconds(1), absl::Seconds(1));
  FdInbox* p = inbox.get();
  auto listener = UnixListener::Start(
      std::move(lo),
      [p](int conn) {
        p->HandleConnection(conn);
        ::close(conn);
      },
      [p] {
        absl::MutexLock lock(&p->mu_);
        p->ExpireLocked(absl::Now());
      });
  if (!listener.ok()) return listener.status();
  inbox->listener_ = *std::move(listener);
  return inbox;
}

FdInbox::~FdInbox() { listener_.reset(); }

void FdInbox::HandleConnection(int conn) {
  const timeval tv = absl::ToTimeval(options_.io_timeout);
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::vector<int> fds;
  absl::Status s = CheckPeer(conn);
  if (s.ok()) s = ReceiveBatch(conn, &fds);
  if (!s.ok()) CloseAll(fds);
  absl::StatusOr<std::string> token = s.ok() ? Admit(std::move(fds)) : s;
  if (!token.ok()) {
    spdlog::warn("{}", std::string(token.status().message()));
    Reply(conn, absl::StrCat("ERR ", token.status().message()));
    return;
  }
  Reply(conn, absl::StrCat("OK ", *token));
}

absl::Status FdInbox::ReceiveBatch(int conn, std::vector<int>* out) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  for (;;) {
    const size_t before = out->size();
    RETURN_IF_ERROR(AwaitReadable(conn, listener_->stop_fd(), deadline));
    absl::StatusOr<std::string> tag = ReceiveMessage(conn, out);
    if (!tag.ok()) return tag.status();
    if (*tag == kDoneTag && out->size() == before) break;
    if (*tag != absl::string_view(kFdsTag, kTagBytes) || out->size() == before) {
      return absl::InvalidArgumentError(absl::StrCat(
          "descriptor socket: expected \"WSFD\" with descriptors or \"DONE\" without, got \"",
          absl::CHexEscape(*tag), "\" with ", out->size() - before, " descriptors"));
    }
    if (out->size() > static_cast<size_t>(options_.max_fds_per_batch)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("descriptor socket: a batch of more than ", options_.max_fds_per_batch,
                       " descriptors (register fewer tensors per call)"));
    }
  }
  if (out->empty()) return absl::InvalidArgumentError("descriptor socket: an empty batch");
  return absl::OkStatus();
}

absl::StatusOr<std::string> FdInbox::Admit(std::vector<int> fds) {
  absl::StatusOr<std::string> token = NewToken();
  absl::MutexLock lock(&mu_);
  ExpireLocked(absl::Now());
  const int32_t count = static_cast<int32_t>(fds.size());
  if (!token.ok() || pending_fds_ + count > options_.max_fds_pending) {
    CloseAll(fds);
    if (!token.ok()) return token.status();
    return absl::ResourceExhaustedError(
        absl::StrCat("descriptor socket: ", pending_fds_, " descriptors wait to be claimed; ",
                     count, " more would pass the limit of ", options_.max_fds_pending));
  }
  pending_fds_ += count;
  pending_[*token] =
      Pending{std::make_shared<const plane::FdBatch>(*token, std::move(fds)), absl::Now()};
  return token;
}

absl::StatusOr<std::shared_ptr<const plane::FdBatch>> FdInbox::Claim(const std::string& token,
                                                                     const std::string& what) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(absl::Now());
  auto it = pending_.find(token);
  if (it == pending_.end()) {
    return absl::NotFoundError(absl::StrCat(
        what, ": descriptor token '", token, "' is unknown, already used or expired (tokens live ",
        absl::FormatDuration(options_.ttl), " and serve one RegisterTensors call)"));
  }
  std::shared_ptr<const plane::FdBatch> batch = std::move(it->second.batch);
  pending_fds_ -= batch->size();
  pending_.erase(it);
  return batch;
}

int32_t FdInbox::pending_fds() const {
  absl::MutexLock lock(&mu_);
  return pending_fds_;
}

void FdInbox::ExpireLocked(absl::Time now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now - it->second.created < options_.ttl) {
      ++it;
      continue;
    }
    spdlog::warn("descriptor socket: batch {} ({} descriptors) expired unclaimed", it->first,
                 it->second.batch->size());
    pending_fds_ -= it->second.batch->size();
    it = pending_.erase(it);
  }
}

}  // namespace wsync::agent
