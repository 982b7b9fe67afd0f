// UnixListener: binds with the mode before anyone connects, hands over each
// connection, ticks, stops promptly, and removes its socket file.
#include "worker/agent/unix_listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

using ::testing::HasSubstr;

class UnixListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / absl::StrCat("wsync_ul_", getpid())).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  UnixListenerOptions Options(int type) const {
    UnixListenerOptions o;
    o.what = "test socket";
    o.path = absl::StrCat(dir_, "/s.sock");
    o.type = type;
    return o;
  }

  static int Connect(const std::string& path, int type) {
    const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  std::string dir_;
};

TEST_F(UnixListenerTest, HandsOverConnectionsWithTheModeAndRemovesTheFile) {
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    std::atomic<int> accepted{0};
    UnixListenerOptions o = Options(type);
    o.mode = 0640;
    auto l = UnixListener::Start(o, [&](int conn) {
      ++accepted;  // before the reply: the client checks the count once it has it
      const char reply = 'k';
      (void)!write(conn, &reply, 1);
      ::close(conn);
    });
    ASSERT_TRUE(l.ok()) << l.status();
    struct stat st {};
    ASSERT_EQ(stat(o.path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0640);
    for (int i = 0; i < 3; ++i) {
      const int fd = Connect(o.path, type);
      ASSERT_GE(fd, 0);
      char got = 0;
      EXPECT_EQ(read(fd, &got, 1), 1);
      EXPECT_EQ(got, 'k');
      ::close(fd);
    }
    EXPECT_EQ(accepted.load(), 3);
    l->reset();
    EXPECT_FALSE(std::filesystem::exists(o.path)) << "type " << type;
    EXPECT_LT(Connect(o.path, type), 0);
  }
}

TEST_F(UnixListenerTest, ReplacesAStaleSocketFile) {
  UnixListenerOptions o = Options(SOCK_STREAM);
  auto first = UnixListener::Start(o, [](int conn) { ::close(conn); });
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = UnixListener::Start(o, [](int conn) { ::close(conn); });
  ASSERT_TRUE(second.ok()) << second.status();
  const int fd = Connect(o.path, SOCK_STREAM);
  EXPECT_GE(fd, 0);
  ::close(fd);
}

TEST_F(UnixListenerTest, TicksWithoutConnections) {
  UnixListenerOptions o = Options(SOCK_STREAM);
  o.tick = absl::Milliseconds(10);
  absl::Notification ticked;
  std::atomic<int> ticks{0};
  auto l = UnixListener::Start(
      o, [](int conn) { ::close(conn); },
      [&] {
        if (++ticks == 3) ticked.Notify();
      });
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(ticked.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

// Teardown does not wait for a slow peer: a callback waiting on its
// connection also watches stop_fd().
TEST_F(UnixListenerTest, StopWakesACallbackWaitingOnStopFd) {
  UnixListenerOptions o = Options(SOCK_STREAM);
  absl::Notification in_callback;
  UnixListener* self = nullptr;
  auto l = UnixListener::Start(o, [&](int conn) {
    in_callback.Notify();
    pollfd fds[2] = {{conn, POLLIN, 0}, {self->stop_fd(), POLLIN, 0}};
    poll(fds, 2, 30000);
    ::close(conn);
  });
  ASSERT_TRUE(l.ok()) << l.status();
  self = l->get();
  const int fd = Connect(o.path, SOCK_STREAM);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(in_callback.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  l->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ::close(fd);
}

TEST_F(UnixListenerTest, RefusesPathsThatCannotBeBound) {
  UnixListenerOptions o = Options(SOCK_STREAM);
  o.path = std::string(200, 'x');
  auto l = UnixListener::Start(o, [](int conn) { ::close(conn); });
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("test socket path"));
  o.path = absl::StrCat(dir_, "/missing/s.sock");
  l = UnixListener::Start(o, [](int conn) { ::close(conn); });
  EXPECT_EQ(l.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("test socket: bind"));
}

}  // namespace
}  // namespace wsync::agent
