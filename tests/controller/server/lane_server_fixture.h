// The fixture of the LaneServer tests (lane_server_test.cc,
// lane_admission_test.cc): the real Controller and Authenticator, the lane
// on a real Unix socket in a temporary directory, clients on it.
#ifndef WSYNC_TESTS_CONTROLLER_SERVER_LANE_SERVER_FIXTURE_H_
#define WSYNC_TESTS_CONTROLLER_SERVER_LANE_SERVER_FIXTURE_H_

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "controller/server/lane_server.h"
#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller::lane_testing {

class LaneServerTest : public controller_testing::CoordinatorFixture {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/lane-XXXXXX");
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    path_ = dir_ + "/lane.sock";
  }
  void TearDown() override {
    lane_.reset();
    rmdir(dir_.c_str());
  }

  void StartLane(AuthOptions auth_options = Insecure(), LaneOptions o = LaneOptions()) {
    auto auth = Authenticator::Create(std::move(auth_options));
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    o.socket_path = path_;
    auto lane = LaneServer::Start(o, controller_.get(), auth_.get());
    ASSERT_TRUE(lane.ok()) << lane.status();
    lane_ = *std::move(lane);
  }
  static AuthOptions Insecure() {
    AuthOptions a;
    a.insecure = true;
    return a;
  }

  std::unique_ptr<LaneClient> Connect() {
    auto c = LaneClient::Connect(path_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static v1::LaneResponse Call(LaneClient& c, v1::LaneRequest req) {
    auto resp = c.Call(std::move(req), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::LaneResponse();
  }
  static v1::LaneRequest Hello(const std::string& lease) {
    v1::LaneRequest r;
    r.mutable_hello()->set_lease_id(lease);
    return r;
  }
  static v1::LaneRequest Report(const std::string& lease, const std::string& sync_id) {
    v1::LaneRequest r;
    r.mutable_report()->set_lease_id(lease);
    r.mutable_report()->set_sync_id(sync_id);
    return r;
  }
  static v1::LaneRequest SyncWaiting(int64_t version, const std::string& token = "") {
    v1::LaneRequest r;
    r.set_token(token);
    r.mutable_sync()->set_transfer("t");
    r.mutable_sync()->set_version(version);
    r.mutable_sync()->set_wait_ms(10'000);
    return r;
  }

  // Three workers with assignment streams, transfer "t" defined.
  void ThreeWorkers() {
    leases_ = {Register("a", "src", 0, 2, 16), Register("b", "src", 1, 2, 16),
               Register("c", "dst", 0, 1, 32)};
    for (const auto& l : leases_) tokens_[l] = *controller_->workers().OpenStream(l);
    DefineSimple();
  }

  // A raw connection (for bytes no LaneClient sends).
  int RawConnect() {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  // Reads the error frame the server sends before it closes `fd`, then
  // checks the end of stream.
  static v1::LaneResponse ReadRefusal(int fd) {
    std::string in;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) in.append(buf, static_cast<size_t>(n));
    EXPECT_EQ(n, 0) << "the server closes the connection";
    auto frame = NextLaneFrame(in, kLaneMaxFrameBytes);
    v1::LaneResponse resp;
    EXPECT_TRUE(frame.ok() && frame->consumed == in.size()) << in.size();
    if (frame.ok()) {
      EXPECT_TRUE(ParseLanePayload(frame->payload, "LaneResponse", &resp).ok());
    }
    return resp;
  }

  std::string dir_, path_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<LaneServer> lane_;
  std::vector<std::string> leases_;
  std::map<std::string, uint64_t> tokens_;
};

}  // namespace wsync::controller::lane_testing

#endif  // WSYNC_TESTS_CONTROLLER_SERVER_LANE_SERVER_FIXTURE_H_
