// The worker's local socket: a private directory, socket modes, SO_PEERCRED
// admission and the peer credentials handlers see (issue 18, item 2).
#include "worker/agent/local_socket.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::agent {
namespace {

std::string TempDir() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-ls-XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(LocalSocketTest, AWorldWritableDirectoryIsRefused) {
  const std::string dir = TempDir();
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  const absl::Status s = EnsurePrivateDir(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("mode 0777"), std::string::npos) << s;
  // So is /tmp itself (sticky, world-writable; root's).
  EXPECT_FALSE(EnsurePrivateDir("/tmp").ok());
  // And a socket placed there.
  LocalSocketOptions o;
  o.path = dir + "/w.sock";
  PeerDirectory peers;
  auto started = LocalSocket::Start(o, nullptr, &peers);
  EXPECT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition) << started.status();
  EXPECT_NE(access(o.path.c_str(), F_OK), 0) << "no socket was created";
}

TEST(LocalSocketTest, AGroupWritableDirectoryOrALinkIsRefused) {
  const std::string dir = TempDir();
  ASSERT_EQ(chmod(dir.c_str(), 0770), 0);
  EXPECT_EQ(EnsurePrivateDir(dir).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  EXPECT_TRUE(EnsurePrivateDir(dir).ok());
  const std::string link = TempDir() + "/link";
  ASSERT_EQ(symlink(dir.c_str(), link.c_str()), 0);
  EXPECT_EQ(EnsurePrivateDir(link).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LocalSocketTest, AMissingDirectoryIsCreatedPrivateWhateverTheUmask) {
  const std::string dir = TempDir() + "/sockets";
  const mode_t old = umask(0);
  const absl::Status s = EnsurePrivateDir(dir);
  umask(old);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ModeOf(dir), 0700);
}

TEST(LocalSocketTest, DefaultPathIsUnderTheRuntimeDirectory) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = xdg != nullptr ? xdg : "";
  setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
  EXPECT_EQ(DefaultSocketPath("inference", 3), "/run/user/1234/wsync/worker-inference-3.sock");
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DefaultSocketPath("g", 0), absl::StrCat("/tmp/wsync-", getuid(), "/worker-g-0.sock"));
  if (xdg != nullptr) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST(LocalSocketTest, AllowedPeers) {
  LocalSocketOptions o;
  PeerCred own{1, getuid(), getgid()};
  PeerCred other{2, getuid() + 1000, getgid() + 1000};
  EXPECT_TRUE(LocalSocket::Allowed(o, own));
  EXPECT_FALSE(LocalSocket::Allowed(o, other));
  o.allowed_uids = {other.uid};
  EXPECT_TRUE(LocalSocket::Allowed(o, other));
  o.allowed_uids.clear();
  o.group = other.gid;
  EXPECT_TRUE(LocalSocket::Allowed(o, other));
  EXPECT_EQ(ParseUids("1000, 1001", "--f").value(), (std::vector<uid_t>{1000, 1001}));
  EXPECT_FALSE(ParseUids("root", "--f").ok());
}

// Answers Status with the pid the PeerDirectory knows for the call.
class PeerEcho final : public v1::WorkerLocal::Service {
 public:
  explicit PeerEcho(const PeerDirectory* peers) : peers_(peers) {}
  grpc::Status Status(grpc::ServerContext* ctx, const v1::LocalStatusRequest*,
                      v1::LocalStatusResponse* resp) override {
    std::optional<PeerCred> cred = peers_->Find(ctx->peer());
    if (!cred.has_value()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown peer " + ctx->peer());
    }
    resp->set_lease_id(absl::StrCat(cred->pid, ":", cred->uid));
    return grpc::Status::OK;
  }

 private:
  const PeerDirectory* const peers_;
};

TEST(LocalSocketTest, ServesWithMode0600AndKnowsEachCallersProcess) {
  const std::string dir = TempDir();
  PeerDirectory peers;
  PeerEcho echo(&peers);
  grpc::ServerBuilder builder;
  builder.RegisterService(&echo);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  LocalSocketOptions o;
  o.path = dir + "/w.sock";
  auto sock = LocalSocket::Start(o, server.get(), &peers);
  ASSERT_TRUE(sock.ok()) << sock.status();
  EXPECT_EQ(ModeOf(o.path), 0600);
  auto stub = v1::WorkerLocal::NewStub(
      grpc::CreateChannel("unix:" + o.path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::LocalStatusResponse resp;
  const grpc::Status s = stub->Status(&ctx, v1::LocalStatusRequest(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.lease_id(), absl::StrCat(getpid(), ":", getuid()));
  sock->reset();
  EXPECT_NE(access(o.path.c_str(), F_OK), 0) << "socket file removed";
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

TEST(LocalSocketTest, AGroupSocketIsMode0660) {
  const std::string dir = TempDir();
  PeerDirectory peers;
  PeerEcho echo(&peers);
  grpc::ServerBuilder builder;
  builder.RegisterService(&echo);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  LocalSocketOptions o;
  o.path = dir + "/w.sock";
  o.group = getgid();
  auto sock = LocalSocket::Start(o, server.get(), &peers);
  ASSERT_TRUE(sock.ok()) << sock.status();
  EXPECT_EQ(ModeOf(o.path), 0660);
  sock->reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace wsync::agent
