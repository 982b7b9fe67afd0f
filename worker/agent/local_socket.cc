#include "worker/agent/local_socket.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "grpcpp/server_posix.h"
#include "worker/agent/unix_listener.h"

namespace wsync::agent {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::StatusOr<PeerCred> PeerOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno("SO_PEERCRED");
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

}  // namespace

void PeerDirectory::Set(int fd, const PeerCred& cred) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = cred;
}

std::optional<PeerCred> PeerDirectory::Find(const std::string& grpc_peer) const {
  int fd = -1;
  if (!absl::StartsWith(grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

std::string DefaultSocketDir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return absl::StrCat(xdg, "/wsync");
  return absl::StrCat("/tmp/wsync-", getuid());
}

std::string DefaultSocketPath(const std::string& group, int32_t rank) {
  return absl::StrCat(DefaultSocketDir(), "/worker-", group, "-", rank, ".sock");
}

absl::StatusOr<std::vector<uid_t>> ParseUids(const std::string& text, const std::string& flag) {
  std::vector<uid_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(part, &uid)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", part, "' is not a numeric uid (comma-separated uids)"));
    }
    out.push_back(static_cast<uid_t>(uid));
  }
  return out;
}

absl::StatusOr<LocalSocketOptions> ResolveLocalSocket(const std::string& path,
                                                      const std::string& group,
                                                      const std::string& allowed_uids,
                                                      const std::string& first_group,
                                                      int32_t rank) {
  LocalSocketOptions o;
  o.path = path.empty() ? DefaultSocketPath(first_group, rank) : path;
  if (!group.empty()) {
    uint32_t gid = 0;
    if (absl::SimpleAtoi(group, &gid)) {
      o.group = static_cast<gid_t>(gid);
    } else {
      const struct group* g = getgrnam(group.c_str());  // NOLINT: startup, single-threaded
      if (g == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--local_socket_group: no group '", group, "'"));
      }
      o.group = g->gr_gid;
    }
  }
  auto uids = ParseUids(allowed_uids, "--local_allowed_uids");
  if (!uids.ok()) return uids.status();
  o.allowed_uids = *std::move(uids);
  return o;
}

absl::Status EnsurePrivateDir(const std::string& dir, std::optional<gid_t> group) {
  const mode_t mode = group.has_value() ? 0710 : 0700;
  if (mkdir(dir.c_str(), mode) == 0) {
    if (group.has_value() && chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0) {
      return Errno(absl::StrCat("local socket directory ", dir, ": chgrp ", *group));
    }
    if (chmod(dir.c_str(), mode) != 0) {  // the umask may have cleared bits
      return Errno(absl::StrCat("local socket directory ", dir, ": chmod"));
    }
  } else if (errno != EEXIST) {
    return Errno(absl::StrCat("local socket directory ", dir, ": mkdir"));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return Errno(absl::StrCat("local socket directory ", dir));
  if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "local socket directory %s is %s owned by uid %d with mode %04o: it must be a directory "
        "of this worker's user (uid %d) that neither its group nor others may write, or another "
        "user could replace the socket (choose another --local_socket)",
        dir, S_ISDIR(st.st_mode) ? "a directory" : "not a directory", st.st_uid, st.st_mode & 07777,
        getuid()));
  }
  return absl::OkStatus();
}

bool LocalSocket::Allowed(const LocalSocketOptions& options, const PeerCred& cred) {
  if (cred.uid == getuid()) return true;
  if (std::find(options.allowed_uids.begin(), options.allowed_uids.end(), cred.uid) !=
      options.allowed_uids.end()) {
    return true;
  }
  return options.group.has_value() && cred.gid == *options.group;
}

absl::StatusOr<std::unique_ptr<LocalSocket>> LocalSocket::Start(LocalSocketOptions options,
                                                                grpc::Server* server,
                                                                PeerDirectory* peers) {
  // A path that cannot be bound is refused by the listener, before any mkdir.
  if (!options.path.empty() && options.path.size() < sizeof(sockaddr_un{}.sun_path)) {
    if (absl::Status s = EnsurePrivateDir(DirOf(options.path), options.group); !s.ok()) return s;
  }
  std::unique_ptr<LocalSocket> sock(new LocalSocket(std::move(options), server, peers));
  UnixListenerOptions lo;
  lo.what = "local socket";
  lo.path = sock->options_.path;
  lo.type = SOCK_STREAM;
  lo.group = sock->options_.group;
  lo.mode = lo.group.has_value() ? 0660 : 0600;
  lo.backlog = 64;
  auto listener =
      UnixListener::Start(std::move(lo), [p = sock.get()](int conn) { p->Admit(conn); });
  if (!listener.ok()) return listener.status();
  sock->listener_ = *std::move(listener);
  return sock;
}

LocalSocket::~LocalSocket() { listener_.reset(); }

void LocalSocket::Admit(int conn) {
  absl::StatusOr<PeerCred> cred = PeerOf(conn);
  if (!cred.ok() || !Allowed(options_, *cred)) {
    spdlog::warn(
        "local socket {}: refused a connection of {} (not this worker's uid {}, "
        "--local_allowed_uids or --local_socket_group)",
        options_.path,
        cred.ok() ? absl::StrCat("pid ", cred->pid, " uid ", cred->uid)
                  : std::string(cred.status().message()),
        getuid());
    ::close(conn);
    return;
  }
  peers_->Set(conn, *cred);
  grpc::AddInsecureChannelFromFd(server_, conn);  // gRPC owns `conn` from here
}

}  // namespace wsync::agent
