#include "worker/agent/fd_inbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// The inbox closes a connection just after answering it: wait for that.
int OpenFdsSettled(int want) {
  for (int i = 0; i < 100 && OpenFds() != want; ++i) absl::SleepFor(absl::Milliseconds(10));
  return OpenFds();
}

class Client {
 public:
  explicit Client(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }

  bool Send(const std::string& tag, const std::vector<int>& fds) {
    iovec iov{const_cast<char*>(tag.data()), tag.size()};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    return sendmsg(fd_, &msg, MSG_NOSIGNAL) >= 0;
  }
  std::string Reply() {
    char buf[1024];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct Pipe {
  Pipe() { EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    close(fds[0]);
    close(fds[1]);
  }
  int fds[2];
};

class FdInboxTest : public ::testing::Test {
 protected:
  void StartInbox(FdInboxOptions o = {}) {
    o.path = absl::StrCat(::testing::TempDir(), "/inbox-", getpid(), ".fds");
    auto inbox = FdInbox::Start(o);
    ASSERT_TRUE(inbox.ok()) << inbox.status();
    inbox_ = *std::move(inbox);
  }
  std::string SendBatch(const std::vector<int>& fds) {
    Client c(inbox_->path());
    EXPECT_TRUE(c.connected());
    for (size_t i = 0; i < fds.size(); i += kMaxFdsPerMessage) {
      const size_t end = std::min(fds.size(), i + kMaxFdsPerMessage);
      EXPECT_TRUE(c.Send("WSFD", std::vector<int>(fds.begin() + i, fds.begin() + end)));
    }
    EXPECT_TRUE(c.Send("DONE", {}));
    return c.Reply();
  }
  std::unique_ptr<FdInbox> inbox_;
};

TEST_F(FdInboxTest, PassesWorkingDescriptorsAndClaimsEachBatchOnce) {
  StartInbox();
  Pipe p;
  const std::string reply = SendBatch({p.fds[1]});
  ASSERT_EQ(reply.rfind("OK ", 0), 0u) << reply;
  const std::string token = reply.substr(3);
  EXPECT_EQ(inbox_->pending_fds(), 1);
  auto batch = inbox_->Claim(token, "tensor 'w'");
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ((*batch)->size(), 1);
  // The worker's copy writes into the owner's pipe.
  ASSERT_EQ(write((*batch)->fd(0), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(p.fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_EQ((*batch)->fd(1), -1);
  EXPECT_EQ(inbox_->pending_fds(), 0);
  auto again = inbox_->Claim(token, "tensor 'w'");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find("tensor 'w'"), std::string::npos);
}

TEST_F(FdInboxTest, BatchesLargerThanOneMessageArriveWhole) {
  StartInbox();
  Pipe p;
  std::vector<int> fds(kMaxFdsPerMessage * 2 + 3, p.fds[1]);
  const std::string reply = SendBatch(fds);
  ASSERT_EQ(reply.rfind("OK ", 0), 0u) << reply;
  auto batch = inbox_->Claim(reply.substr(3), "t");
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ((*batch)->size(), static_cast<int32_t>(fds.size()));
}

TEST_F(FdInboxTest, UnclaimedBatchesExpireAndCloseTheirDescriptors) {
  FdInboxOptions o;
  o.ttl = absl::Milliseconds(50);
  StartInbox(o);
  const int before = OpenFds();
  Pipe p;
  const std::string reply = SendBatch({p.fds[0], p.fds[1]});
  ASSERT_EQ(reply.rfind("OK ", 0), 0u);
  absl::SleepFor(absl::Milliseconds(80));
  auto batch = inbox_->Claim(reply.substr(3), "t");
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(inbox_->pending_fds(), 0);
  EXPECT_EQ(OpenFdsSettled(before + 2), before + 2);  // only the test's own pipe
}

TEST_F(FdInboxTest, RefusesMalformedBatchesWithoutLeaking) {
  FdInboxOptions o;
  o.max_fds_per_batch = 4;
  StartInbox(o);
  Pipe p;
  const int before = OpenFds();
  {
    Client c(inbox_->path());
    ASSERT_TRUE(c.Send("HELO", {p.fds[0]}));
    EXPECT_NE(c.Reply().find("ERR descriptor socket: expected"), std::string::npos);
  }
  {
    Client c(inbox_->path());
    ASSERT_TRUE(c.Send("DONE", {}));
    EXPECT_NE(c.Reply().find("empty batch"), std::string::npos);
  }
  {
    Client c(inbox_->path());
    ASSERT_TRUE(c.Send("WSFD", std::vector<int>(5, p.fds[0])));
    EXPECT_NE(c.Reply().find("more than 4 descriptors"), std::string::npos);
  }
  {
    Client c(inbox_->path());
    ASSERT_TRUE(c.Send("WSFD", std::vector<int>(kMaxFdsPerMessage + 3, p.fds[0])));
    EXPECT_NE(c.Reply().find("ERR"), std::string::npos);
  }
  EXPECT_EQ(OpenFdsSettled(before), before);
  EXPECT_EQ(inbox_->pending_fds(), 0);
}

TEST_F(FdInboxTest, ASilentOwnerTimesOutAndTheNextOneIsServed) {
  FdInboxOptions o;
  o.io_timeout = absl::Milliseconds(100);
  StartInbox(o);
  Pipe p;
  Client silent(inbox_->path());
  ASSERT_TRUE(silent.Send("WSFD", {p.fds[0]}));  // never says DONE
  EXPECT_NE(silent.Reply().find("did not send its whole batch in time"), std::string::npos);
  EXPECT_EQ(SendBatch({p.fds[1]}).rfind("OK ", 0), 0u);
}

TEST_F(FdInboxTest, ADrippingOwnerIsCutOffAtTheBatchDeadline) {
  FdInboxOptions o;
  o.io_timeout = absl::Milliseconds(200);
  StartInbox(o);
  Pipe p;
  Client drip(inbox_->path());
  const absl::Time t0 = absl::Now();
  // A message every 50 ms never lets a per-message timeout fire.
  for (int i = 0; i < 20 && drip.Send("WSFD", {p.fds[0]}); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_NE(drip.Reply().find("in time"), std::string::npos);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(SendBatch({p.fds[1]}).rfind("OK ", 0), 0u);
}

TEST_F(FdInboxTest, StoppingEndsAConnectionInProgress) {
  FdInboxOptions o;
  o.io_timeout = absl::Seconds(30);
  StartInbox(o);
  Pipe p;
  Client stuck(inbox_->path());
  ASSERT_TRUE(stuck.Send("WSFD", {p.fds[0]}));  // and nothing more
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time t0 = absl::Now();
  inbox_.reset();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

TEST_F(FdInboxTest, ExpiresWithoutAnyFurtherTraffic) {
  FdInboxOptions o;
  o.ttl = absl::Milliseconds(100);
  StartInbox(o);
  Pipe p;
  const int before = OpenFds();
  ASSERT_EQ(SendBatch({p.fds[0], p.fds[1]}).rfind("OK ", 0), 0u);
  for (int i = 0; i < 200 && inbox_->pending_fds() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(inbox_->pending_fds(), 0);
  EXPECT_EQ(OpenFdsSettled(before), before);
}

TEST_F(FdInboxTest, TheSocketFileIsPrivate) {
  StartInbox();
  struct stat st {};
  ASSERT_EQ(stat(inbox_->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(FdInboxTest, LimitsDescriptorsWaitingToBeClaimed) {
  FdInboxOptions o;
  o.max_fds_pending = 3;
  StartInbox(o);
  Pipe p;
  ASSERT_EQ(SendBatch({p.fds[0], p.fds[1]}).rfind("OK ", 0), 0u);
  const std::string reply = SendBatch({p.fds[0], p.fds[1]});
  EXPECT_NE(reply.find("wait to be claimed"), std::string::npos) << reply;
  EXPECT_EQ(inbox_->pending_fds(), 2);
}

TEST(FdInboxStartTest, RefusesAPathTooLongForASocket) {
  FdInboxOptions o;
  o.path = std::string(200, 'x');
  auto inbox = FdInbox::Start(o);
  EXPECT_EQ(inbox.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FdInboxStartTest, SocketPathSitsBesideTheLocalSocket) {
  EXPECT_EQ(FdSocketPath("/tmp/w.sock"), "/tmp/w.sock.fds");
}

}  // namespace
}  // namespace wsync::agent
