#include "common/lane_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/busy_poll.h"

namespace wsync {
namespace {

// Milliseconds until `t` for poll(2): rounded up, at least 0, at most 1 s
// (the caller loops).
int PollMs(absl::Time t) {
  const absl::Duration left = t - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LaneClient>> LaneClient::Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("lane socket path '", path, "' must have 1 to ",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("lane: socket: ", std::strerror(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("lane: cannot connect to ", path, ": ", std::strerror(err)));
  }
  // Whoever listens there gets this caller's token or lease secret and
  // sends it assignments: only a process of this user (or root) may.
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      (cred.uid != geteuid() && cred.uid != 0)) {
    const int err = errno;
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "lane: ", path, " is served by ",
        len == sizeof(cred) ? absl::StrCat("uid ", cred.uid) : std::string(std::strerror(err)),
        ", not by this user (uid ", geteuid(), ") or root: not trusted"));
  }
  return std::unique_ptr<LaneClient>(new LaneClient(fd, path));
}

LaneClient::~LaneClient() { Close(); }

void LaneClient::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  in_.clear();
}

absl::Status LaneClient::Broken(absl::Status status) {
  Close();
  return status;
}

absl::StatusOr<uint64_t> LaneClient::Send(v1::LaneRequest req, absl::Time deadline) {
  if (fd_ < 0) return absl::UnavailableError(absl::StrCat("lane ", path_, ": connection closed"));
  const uint64_t id = next_call_id_++;
  req.set_call_id(id);
  std::string frame;
  if (absl::Status st = AppendLaneFrame(req, kLaneMaxFrameBytes, &frame); !st.ok()) return st;
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Now() >= deadline) {
        return Broken(absl::DeadlineExceededError(
            absl::StrCat("lane ", path_, ": the controller did not take the request in time")));
      }
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, PollMs(deadline));
      continue;
    }
    return Broken(absl::UnavailableError(
        absl::StrCat("lane ", path_, ": send: ", std::strerror(n < 0 ? errno : EPIPE))));
  }
  return id;
}

absl::StatusOr<bool> LaneClient::TakeFrame(uint64_t call_id, v1::LaneResponse* out) {
  absl::StatusOr<LaneFrame> frame = NextLaneFrame(in_, kLaneMaxResponseBytes);
  if (!frame.ok()) return Broken(absl::UnavailableError(frame.status().message()));
  if (frame->consumed == 0) return false;
  absl::Status parsed = ParseLanePayload(frame->payload, "LaneResponse", out);
  in_.erase(0, frame->consumed);
  if (!parsed.ok()) return Broken(absl::UnavailableError(parsed.message()));
  if (out->call_id() != call_id) {
    // call_id 0: the controller refused the connection or a frame
    // (malformed, too large) and closes it.
    refused_ = out->call_id() == 0;
    return Broken(absl::UnavailableError(
        out->call_id() == 0
            ? absl::StrCat("lane ", path_,
                           ": the controller refused the connection: ", out->message())
            : absl::StrCat("lane ", path_, ": response to call ", out->call_id(),
                           " while waiting for call ", call_id)));
  }
  return true;
}

absl::StatusOr<std::optional<v1::LaneResponse>> LaneClient::Receive(uint64_t call_id,
                                                                    absl::Time until, bool spin) {
  v1::LaneResponse resp;
  char chunk[64 << 10];
  while (true) {
    if (fd_ < 0) return absl::UnavailableError(absl::StrCat("lane ", path_, ": connection closed"));
    absl::StatusOr<bool> got = TakeFrame(call_id, &resp);
    if (!got.ok()) return got.status();
    if (*got) return std::optional<v1::LaneResponse>(std::move(resp));
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      in_.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      return Broken(absl::UnavailableError(
          absl::StrCat("lane ", path_, ": the controller closed the connection")));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Broken(
          absl::UnavailableError(absl::StrCat("lane ", path_, ": recv: ", std::strerror(errno))));
    }
    if (absl::Now() >= until) return std::optional<v1::LaneResponse>();
    if (spin) {
      BusyPoll::Relax();
    } else {
      pollfd p{fd_, POLLIN, 0};
      poll(&p, 1, PollMs(until));
    }
  }
}

absl::StatusOr<v1::LaneResponse> LaneClient::Call(v1::LaneRequest req, absl::Time deadline,
                                                  bool spin) {
  absl::StatusOr<uint64_t> id = Send(std::move(req), deadline);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::optional<v1::LaneResponse>> resp = Receive(*id, deadline, spin);
  if (!resp.ok()) return resp.status();
  if (!resp->has_value()) {
    return Broken(absl::DeadlineExceededError(
        absl::StrCat("lane ", path_, ": no answer before the deadline")));
  }
  return **std::move(resp);
}

absl::Status LaneResponseStatus(const v1::LaneResponse& resp) {
  if (resp.code() == 0) return absl::OkStatus();
  const int code = resp.code() > 0 && resp.code() <= 16 ? resp.code() : 2;  // UNKNOWN
  return absl::Status(static_cast<absl::StatusCode>(code), resp.message());
}

}  // namespace wsync
