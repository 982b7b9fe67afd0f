// The control fast lane's frames (common/lane_frame.h) and its client
// (common/lane_client.h) against a raw Unix socket in the test.
#include "common/lane_frame.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "gtest/gtest.h"
#include "wsync/v1/lane.pb.h"

namespace wsync {
namespace {

v1::LaneRequest Hello(const std::string& lease) {
  v1::LaneRequest r;
  r.set_call_id(7);
  r.mutable_hello()->set_lease_id(lease);
  return r;
}

TEST(LaneFrame, RoundTripsAndWaitsForWholeFrames) {
  std::string buf;
  ASSERT_TRUE(AppendLaneFrame(Hello("a"), kLaneMaxFrameBytes, &buf).ok());
  ASSERT_TRUE(AppendLaneFrame(v1::LaneRequest(), kLaneMaxFrameBytes, &buf).ok());  // empty
  const size_t first = kLaneHeaderBytes + Hello("a").ByteSizeLong();
  ASSERT_EQ(buf.size(), first + kLaneHeaderBytes);
  for (size_t cut = 0; cut < first; ++cut) {  // every prefix: incomplete, no error
    auto f = NextLaneFrame(absl::string_view(buf).substr(0, cut), kLaneMaxFrameBytes);
    ASSERT_TRUE(f.ok()) << cut;
    EXPECT_EQ(f->consumed, 0u) << cut;
  }
  auto f = NextLaneFrame(buf, kLaneMaxFrameBytes);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->consumed, first);
  v1::LaneRequest back;
  ASSERT_TRUE(ParseLanePayload(f->payload, "LaneRequest", &back).ok());
  EXPECT_EQ(back.call_id(), 7u);
  EXPECT_EQ(back.hello().lease_id(), "a");
  auto empty = NextLaneFrame(absl::string_view(buf).substr(first), kLaneMaxFrameBytes);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->consumed, kLaneHeaderBytes);
  EXPECT_TRUE(empty->payload.empty());
}

TEST(LaneFrame, TheLimitHoldsBothWays) {
  const v1::LaneRequest big = Hello(std::string(100, 'x'));
  const uint32_t size = static_cast<uint32_t>(big.ByteSizeLong());
  std::string buf = "kept";
  auto refused = AppendLaneFrame(big, size - 1, &buf);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(buf, "kept") << "nothing appended";
  buf.clear();
  ASSERT_TRUE(AppendLaneFrame(big, size, &buf).ok());  // exactly the limit
  EXPECT_TRUE(NextLaneFrame(buf, size).ok());
  auto over = NextLaneFrame(buf, size - 1);  // from the header alone
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find(absl::StrCat("announces ", size, " bytes")),
            std::string::npos)
      << over.status();
  const char huge[] = {'\xff', '\xff', '\xff', '\xff'};
  EXPECT_FALSE(NextLaneFrame(absl::string_view(huge, 4), kLaneMaxFrameBytes).ok());
  v1::LaneRequest r;
  auto bad = ParseLanePayload("\xff\xff\xff", "LaneRequest", &r);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("not a LaneRequest"), std::string::npos) << bad;
}

// A listener the test answers by hand.
class RawListener {
 public:
  RawListener() {
    dir_ = absl::StrCat(::testing::TempDir(), "/lane-client-XXXXXX");
    EXPECT_NE(mkdtemp(dir_.data()), nullptr);
    path = dir_ + "/s";
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    EXPECT_EQ(bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
  }
  ~RawListener() {
    close(fd_);
    unlink(path.c_str());
    rmdir(dir_.c_str());
  }
  int Accept() { return accept(fd_, nullptr, nullptr); }
  std::string path;

 private:
  std::string dir_;
  int fd_ = -1;
};

// Reads one request frame from `fd`.
v1::LaneRequest ReadRequest(int fd) {
  std::string in;
  char buf[1024];
  v1::LaneRequest req;
  while (true) {
    auto f = NextLaneFrame(in, kLaneMaxFrameBytes);
    if (f.ok() && f->consumed > 0) {
      EXPECT_TRUE(ParseLanePayload(f->payload, "LaneRequest", &req).ok());
      return req;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return req;
    in.append(buf, static_cast<size_t>(n));
  }
}

void Answer(int fd, uint64_t call_id, int code) {
  v1::LaneResponse resp;
  resp.set_call_id(call_id);
  resp.set_code(code);
  resp.set_message("m");
  std::string out;
  ASSERT_TRUE(AppendLaneFrame(resp, kLaneMaxFrameBytes, &out).ok());
  ASSERT_EQ(send(fd, out.data(), out.size(), MSG_NOSIGNAL), static_cast<ssize_t>(out.size()));
}

TEST(LaneClient, CallsInTurnAndBreaksOnAnAnswerOutOfTurnACloseOrARefusal) {
  RawListener l;
  std::thread server([&] {
    const int fd = l.Accept();
    v1::LaneRequest a = ReadRequest(fd);
    Answer(fd, a.call_id(), 5);  // NOT_FOUND, in turn
    v1::LaneRequest b = ReadRequest(fd);
    Answer(fd, b.call_id() + 100, 0);  // out of turn
    close(fd);
    const int fd2 = l.Accept();
    (void)ReadRequest(fd2);
    close(fd2);  // no answer at all
    const int fd3 = l.Accept();
    (void)ReadRequest(fd3);
    Answer(fd3, 0, 8);  // call_id 0: the connection refused (over a limit)
    close(fd3);
  });
  auto c = LaneClient::Connect(l.path);
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->Call(Hello("x"), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(LaneResponseStatus(*r).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LaneResponseStatus(*r).message(), "m");
  r = (*c)->Call(Hello("x"), absl::Now() + absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE((*c)->broken());
  EXPECT_FALSE((*c)->refused()) << "an answer out of turn is no refusal";
  EXPECT_EQ((*c)->Call(Hello("x"), absl::Now() + absl::Seconds(5)).status().code(),
            absl::StatusCode::kUnavailable);
  auto c2 = LaneClient::Connect(l.path);
  ASSERT_TRUE(c2.ok());
  r = (*c2)->Call(Hello("x"), absl::Now() + absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("closed the connection"), std::string::npos) << r.status();
  EXPECT_FALSE((*c2)->refused()) << "a close without an answer may follow a started call";
  auto c3 = LaneClient::Connect(l.path);
  ASSERT_TRUE(c3.ok());
  r = (*c3)->Call(Hello("x"), absl::Now() + absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE((*c3)->refused()) << r.status();
  server.join();
}

TEST(LaneClient, TakesAnAnswerLargerThanTheRequestLimit) {
  // An assignment carries a worker's whole op list: answers may be as large
  // as gRPC's (kLaneMaxResponseBytes), far past the 16 MiB of a request.
  RawListener l;
  std::thread server([&] {
    const int fd = l.Accept();
    v1::LaneRequest a = ReadRequest(fd);
    v1::LaneResponse resp;
    resp.set_call_id(a.call_id());
    resp.set_message(std::string(kLaneMaxFrameBytes + (1u << 20), 'a'));
    std::string out;
    ASSERT_TRUE(AppendLaneFrame(resp, kLaneMaxResponseBytes, &out).ok());
    size_t sent = 0;
    while (sent < out.size()) {
      const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    close(fd);
  });
  auto c = LaneClient::Connect(l.path);
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->Call(Hello("x"), absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->message().size(), kLaneMaxFrameBytes + (1u << 20));
  server.join();
}

TEST(LaneClient, ReceiveReturnsEmptyHandedUntilTheAnswerAndConnectNamesThePath) {
  RawListener l;
  int peer = -1;
  std::thread accept([&] { peer = l.Accept(); });
  auto c = LaneClient::Connect(l.path);
  ASSERT_TRUE(c.ok());
  accept.join();
  auto id = (*c)->Send(Hello("x"), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(id.ok());
  auto none = (*c)->Receive(*id, absl::Now() + absl::Milliseconds(20), /*spin=*/true);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  (void)ReadRequest(peer);
  Answer(peer, *id, 0);
  auto got = (*c)->Receive(*id, absl::Now() + absl::Seconds(5), /*spin=*/true);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  close(peer);
  auto absent = LaneClient::Connect(l.path + ".absent");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(absent.status().message().find(l.path + ".absent"), std::string::npos);
  EXPECT_EQ(LaneClient::Connect(std::string(200, 'p')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wsync
