// LaneServer (controller/server/lane_server.h) in process, with the real
// Controller and Authenticator and clients on its real Unix socket: a sync
// over the lane end to end, the admission rules, malformed frames, a peer
// that stops reading, the socket file's rules.
#include "controller/server/lane_server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "gmock/gmock.h"
#include "tests/controller/server/lane_server_fixture.h"

namespace wsync::controller {
namespace {

using lane_testing::LaneServerTest;
using ::testing::HasSubstr;

TEST_F(LaneServerTest, TheLastReportOverTheLaneAnswersTheWaitingTrainer) {
  ThreeWorkers();
  StartLane();
  auto trainer = Connect();
  ASSERT_NE(trainer, nullptr);
  auto id = trainer->Send(SyncWaiting(1), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(id.ok()) << id.status();
  auto early = trainer->Receive(*id, absl::Now() + absl::Milliseconds(50), false);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->has_value()) << "answered before the workers reported";
  for (const std::string& l : leases_) {
    auto worker = Connect();
    ASSERT_NE(worker, nullptr);
    v1::LaneResponse hello = Call(*worker, Hello(l));
    ASSERT_EQ(hello.code(), 0) << hello.message();
    const v1::SyncAssignment a = Next(l, tokens_[l]);
    v1::LaneResponse ack = Call(*worker, Report(l, a.sync_id()));
    EXPECT_EQ(ack.code(), 0) << ack.message();
    EXPECT_TRUE(ack.has_report());
  }
  auto answer = trainer->Receive(*id, absl::Now() + absl::Seconds(5), false);
  ASSERT_TRUE(answer.ok() && answer->has_value()) << answer.status();
  const v1::LaneResponse& resp = **answer;
  EXPECT_EQ(resp.code(), 0) << resp.message();
  EXPECT_FALSE(resp.sync().sync_id().empty());
  EXPECT_EQ(resp.sync().status().phase(), v1::SYNC_SUCCEEDED) << resp.sync().status().error();
  EXPECT_EQ(resp.sync().status().version(), 1);
}

// With the lane's waits full, a Sync that would wait is refused before it
// starts (answered after starting, the refusal would read as a failed sync
// while it ran); once a wait frees, the same request starts the sync.
TEST_F(LaneServerTest, ASyncThatWouldWaitIsRefusedUnstartedWhileTheWaitsAreFull) {
  ThreeWorkers();
  LaneOptions o;
  o.max_waits = 1;
  StartLane(Insecure(), o);
  auto first = Connect();
  ASSERT_NE(first, nullptr);
  auto id = first->Send(SyncWaiting(1), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(id.ok()) << id.status();
  auto early = first->Receive(*id, absl::Now() + absl::Milliseconds(50), false);
  ASSERT_TRUE(early.ok() && !early->has_value()) << "the first sync waits";
  auto second = Connect();
  ASSERT_NE(second, nullptr);
  const v1::LaneResponse refused = Call(*second, SyncWaiting(2));
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.message();
  EXPECT_THAT(refused.message(), HasSubstr("not started"));
  EXPECT_TRUE(refused.not_started()) << "the caller may make it over gRPC";
  bool waited = false;
  for (const std::string& l : leases_) {
    auto worker = Connect();
    ASSERT_NE(worker, nullptr);
    ASSERT_EQ(Call(*worker, Hello(l)).code(), 0);
    const v1::SyncAssignment a = Next(l, tokens_[l]);
    EXPECT_EQ(a.version(), 1) << "version 2 never started";
    if (!waited) {
      // Version 1 runs and holds the lane's one wait: a WaitSync of it is
      // refused unstarted too.
      waited = true;
      v1::LaneRequest wait;
      wait.mutable_wait_sync()->set_sync_id(a.sync_id());
      const v1::LaneResponse w = Call(*second, wait);
      EXPECT_EQ(w.code(), static_cast<int>(absl::StatusCode::kResourceExhausted)) << w.message();
      EXPECT_TRUE(w.not_started());
    }
    EXPECT_EQ(Call(*worker, Report(l, a.sync_id())).code(), 0);
  }
  auto answer = first->Receive(*id, absl::Now() + absl::Seconds(5), false);
  ASSERT_TRUE(answer.ok() && answer->has_value()) << answer.status();
  EXPECT_EQ((*answer)->sync().status().phase(), v1::SYNC_SUCCEEDED);
  auto again = second->Send(SyncWaiting(2), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  auto pending = second->Receive(*again, absl::Now() + absl::Milliseconds(100), false);
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(pending->has_value()) << "version 2 started and waits";
}

TEST_F(LaneServerTest, ASyncEndedOffTheLaneReachesItsWaiterAndWaitSyncWorks) {
  ThreeWorkers();
  StartLane();
  auto trainer = Connect();
  ASSERT_NE(trainer, nullptr);
  auto id = trainer->Send(SyncWaiting(1), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(id.ok());
  std::string sync_id;
  for (const std::string& l : leases_) {  // as over gRPC: not on the lane's thread
    const v1::SyncAssignment a = Next(l, tokens_[l]);
    sync_id = a.sync_id();
    ReportOk(l, a);
  }
  auto answer = trainer->Receive(*id, absl::Now() + absl::Seconds(5), false);
  ASSERT_TRUE(answer.ok() && answer->has_value()) << answer.status();
  EXPECT_EQ((*answer)->sync().status().phase(), v1::SYNC_SUCCEEDED);
  v1::LaneRequest wait;
  wait.mutable_wait_sync()->set_sync_id(sync_id);
  v1::LaneResponse waited = Call(*trainer, wait);
  EXPECT_EQ(waited.code(), 0) << waited.message();
  EXPECT_EQ(waited.wait_sync().phase(), v1::SYNC_SUCCEEDED);
  wait.mutable_wait_sync()->set_sync_id("no-such-sync");
  waited = Call(*trainer, wait);
  EXPECT_EQ(waited.code(), static_cast<int>(absl::StatusCode::kNotFound)) << waited.message();
}

TEST_F(LaneServerTest, AssignmentsStreamOverTheLaneAndItsEndEndsTheLease) {
  leases_ = {Register("a", "src", 0, 2, 16), Register("b", "src", 1, 2, 16),
             Register("c", "dst", 0, 1, 32)};
  DefineSimple();
  StartLane();
  std::vector<std::unique_ptr<LaneClient>> streams;
  std::vector<uint64_t> calls;
  for (const std::string& l : leases_) {
    streams.push_back(Connect());
    ASSERT_NE(streams.back(), nullptr);
    v1::LaneRequest open;
    open.mutable_assignments()->set_lease_id(l);
    v1::LaneResponse opened = Call(*streams.back(), open);
    ASSERT_EQ(opened.code(), 0) << opened.message();
    EXPECT_FALSE(opened.has_assignment());
    calls.push_back(opened.call_id());
  }
  auto trainer = Connect();
  ASSERT_NE(trainer, nullptr);
  auto id = trainer->Send(SyncWaiting(1), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(id.ok());
  std::vector<std::unique_ptr<LaneClient>> reporters;
  for (size_t i = 0; i < leases_.size(); ++i) {
    auto got = streams[i]->Receive(calls[i], absl::Now() + absl::Seconds(5), /*spin=*/false);
    ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
    ASSERT_EQ((*got)->code(), 0) << (*got)->message();
    ASSERT_TRUE((*got)->assignment().has_sync());
    EXPECT_EQ((*got)->assignment().sync().version(), 1);
    reporters.push_back(Connect());
    ASSERT_EQ(Call(*reporters.back(), Hello(leases_[i])).code(), 0);
    EXPECT_EQ(
        Call(*reporters.back(), Report(leases_[i], (*got)->assignment().sync().sync_id())).code(),
        0);
  }
  auto answer = trainer->Receive(*id, absl::Now() + absl::Seconds(5), false);
  ASSERT_TRUE(answer.ok() && answer->has_value()) << answer.status();
  EXPECT_EQ((*answer)->sync().status().phase(), v1::SYNC_SUCCEEDED);
  // A second stream on a streaming connection is refused.
  v1::LaneRequest again;
  again.mutable_assignments()->set_lease_id(leases_[0]);
  auto twice = streams[0]->Call(again, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(twice->code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  // A stream that ends (its connection closed) ends the lease, as on gRPC.
  EXPECT_TRUE(controller_->workers().IsAlive(leases_[2]));
  streams[2].reset();
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (controller_->workers().IsAlive(leases_[2]) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_FALSE(controller_->workers().IsAlive(leases_[2]));
}

TEST_F(LaneServerTest, AWorkerProvesALiveLeaseAndReportsOnlyForIt) {
  ThreeWorkers();
  StartLane();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  v1::LaneResponse r = Call(*c, Report(leases_[0], "s"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.message(), HasSubstr("send LaneHello first"));
  r = Call(*c, Hello("not-a-lease"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(r.message(), HasSubstr("not a live lease"));
  r = Call(*c, Hello(""));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  ASSERT_EQ(Call(*c, Hello(leases_[0])).code(), 0);
  r = Call(*c, Report(leases_[1], "s"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(r.message(), HasSubstr("another lease"));
  EXPECT_THAT(r.message(), ::testing::Not(HasSubstr(leases_[1]))) << "never echo a secret";
  r = Call(*c, v1::LaneRequest());  // no call: an error, the connection stays
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.message(), HasSubstr("names no call"));
  EXPECT_FALSE(c->broken());
  r = Call(*c, Report(leases_[0], "unknown-sync"));  // the coordinator's own answer
  EXPECT_NE(r.code(), 0);
}

TEST_F(LaneServerTest, TrainerCallsNeedTheirTokenWhenATokensFileIsSet) {
  ThreeWorkers();
  const std::string tokens = dir_ + "/tokens";
  std::ofstream(tokens) << "trainer-token-0123456789 trainer t\nreader-token-0123456789 reader r\n";
  AuthOptions a = Insecure();
  a.tokens_file = tokens;
  StartLane(a);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  v1::LaneResponse r = Call(*c, SyncWaiting(1));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(r.message(), HasSubstr("Sync: no credentials"));
  r = Call(*c, SyncWaiting(1, "wrong-token-0123456789"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(r.message(), HasSubstr("not in --tokens_file"));
  r = Call(*c, SyncWaiting(1, "reader-token-0123456789"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(r.message(), HasSubstr("Sync needs role trainer; identity 'token:r'"));
  v1::LaneRequest nowait = SyncWaiting(1, "trainer-token-0123456789");
  nowait.mutable_sync()->set_wait_ms(0);
  r = Call(*c, nowait);
  EXPECT_EQ(r.code(), 0) << r.message();
  EXPECT_FALSE(r.sync().sync_id().empty()) << "started, not waited for";
  unlink(tokens.c_str());
}

TEST_F(LaneServerTest, MalformedFramesGetAnErrorAndTheConnectionClosed) {
  StartLane();
  int fd = RawConnect();
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};  // ~2 GiB announced
  ASSERT_EQ(send(fd, huge, 4, MSG_NOSIGNAL), 4);
  v1::LaneResponse r = ReadRefusal(fd);
  close(fd);
  EXPECT_EQ(r.call_id(), 0u);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.message(), HasSubstr("over the limit"));

  fd = RawConnect();
  const std::string garbage = std::string("\x05\x00\x00\x00", 4) + "\xff\xff\xff\xff\xff";
  ASSERT_EQ(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  r = ReadRefusal(fd);
  close(fd);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.message(), HasSubstr("not a LaneRequest"));

  auto c = Connect();  // the server goes on
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Call(*c, Hello("x")).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
}

TEST_F(LaneServerTest, APeerThatStopsReadingIsDropped) {
  LaneOptions o;
  o.max_pending_bytes = 4096;
  StartLane(Insecure(), o);
  const int fd = RawConnect();
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  v1::LaneRequest wait;
  wait.mutable_wait_sync()->set_sync_id("no-such-sync");  // answered at once
  std::string batch;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(AppendLaneFrame(wait, kLaneMaxFrameBytes, &batch).ok());
  bool dropped = false;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (!dropped && absl::Now() < until) {  // never reads an answer
    dropped = send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
              errno != EAGAIN && errno != EWOULDBLOCK;
    if (!dropped) absl::SleepFor(absl::Microseconds(200));
  }
  close(fd);
  EXPECT_TRUE(dropped) << "the server kept a peer that reads nothing";
  auto c = Connect();  // and it serves the others
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Call(*c, Hello("x")).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
}

TEST_F(LaneServerTest, TheSocketIsOwnerOnlyAndALiveOneIsNeverReplaced) {
  StartLane();
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto auth = Authenticator::Create(Insecure());
  LaneOptions o;
  o.socket_path = path_;
  auto second = LaneServer::Start(o, controller_.get(), auth->get());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  const std::string file = dir_ + "/plain";
  std::ofstream(file) << "not a socket";
  o.socket_path = file;
  second = LaneServer::Start(o, controller_.get(), auth->get());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument) << second.status();
  unlink(file.c_str());
  o.socket_path = dir_ + "/" + std::string(200, 'x');
  EXPECT_EQ(LaneServer::Start(o, controller_.get(), auth->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  lane_.reset();
  EXPECT_NE(stat(path_.c_str(), &st), 0) << "the socket file is removed at the end";
  // A dead controller's socket file is replaced.
  const int dead = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  ASSERT_EQ(bind(dead, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  close(dead);  // the file stays, nobody listens
  StartLane();
  EXPECT_NE(Connect(), nullptr);
}

// The socket path's rules: another user's socket is never replaced (nor
// removed), and a server removes at the end only the socket it created,
// not one another process put at the path since.
TEST_F(LaneServerTest, OnlyItsOwnSocketIsReplacedOrRemoved) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a socket file to another user";
  const int other = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  ASSERT_EQ(bind(other, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  close(other);  // dead, but another user's
  ASSERT_EQ(chown(path_.c_str(), 65534, 65534), 0);
  auto auth = Authenticator::Create(Insecure());
  LaneOptions o;
  o.socket_path = path_;
  auto refused = LaneServer::Start(o, controller_.get(), auth->get());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("uid 65534"));
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0) << "left in place";
  ASSERT_EQ(unlink(path_.c_str()), 0);

  StartLane();
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, geteuid());
  // Someone replaces the path with a socket of their own (a newer
  // controller's): this server's end leaves it alone.
  ASSERT_EQ(unlink(path_.c_str()), 0);
  const int newer = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(bind(newer, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  struct stat newer_st;
  ASSERT_EQ(lstat(path_.c_str(), &newer_st), 0);
  lane_.reset();
  ASSERT_EQ(lstat(path_.c_str(), &st), 0) << "another process's socket was removed";
  EXPECT_EQ(st.st_ino, newer_st.st_ino);
  close(newer);
  unlink(path_.c_str());
}

// Under any umask the socket is owner-only once it accepts connections
// (its mode is set before listen(); the umask, the whole process's, is
// left alone).
TEST_F(LaneServerTest, TheSocketIsCreatedOwnerOnlyUnderAPermissiveUmask) {
  const mode_t old_mask = umask(0);
  StartLane();
  umask(old_mask);
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
}

// A frame of several MiB grows the connection's buffers; once it is
// answered they shrink again (the connection stays open).
TEST_F(LaneServerTest, ALargeFramesBuffersAreGivenBack) {
  StartLane();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  v1::LaneRequest big = Hello("x");
  big.set_token(std::string(8 << 20, 't'));
  v1::LaneResponse r = Call(*c, big);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated)) << r.message();
  // A second call's answer: the first frame's handling is over.
  EXPECT_EQ(Call(*c, Hello("x")).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_LT(lane_->buffer_bytes(), size_t{2} << 20) << "the 8 MiB read buffer was kept";
}

// /proc/self/task/<tid>/stat of this process's thread named `name` ("" if
// none).
std::string ThreadStatPath(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string n;
    std::getline(comm, n);
    if (n == name) return (task.path() / "stat").string();
  }
  return "";
}

// CPU time (user + system) in a thread's stat file, read again from the
// start (opened once: reading needs no new descriptor).
absl::Duration ThreadCpu(std::ifstream& stat) {
  stat.clear();
  stat.seekg(0);
  std::string line;
  std::getline(stat, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string f;
  int64_t ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stoll(f);  // utime, stime
  }
  return absl::Seconds(static_cast<double>(ticks) / sysconf(_SC_CLK_TCK));
}

// Out of descriptors, accept fails with EMFILE while the connection waits
// in the backlog: the lane backs off instead of spinning, and accepts it
// once descriptors are free again.
TEST_F(LaneServerTest, AcceptBacksOffWhenOutOfDescriptors) {
  StartLane();
  const std::string stat_path = ThreadStatPath("wsync-lane");
  ASSERT_FALSE(stat_path.empty()) << "no lane thread";
  std::ifstream stat(stat_path);
  ASSERT_TRUE(stat.is_open()) << stat_path;
  rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  const int lowest = dup(0);  // the lowest free descriptor
  ASSERT_GE(lowest, 0);
  close(lowest);
  rlimit low = old_limit;
  low.rlim_cur = static_cast<rlim_t>(lowest) + 1;  // the client's socket, not the server's
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const int fd = RawConnect();
  const absl::Duration before = ThreadCpu(stat);
  absl::SleepFor(absl::Milliseconds(600));
  const absl::Duration spent = ThreadCpu(stat) - before;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old_limit), 0);
  EXPECT_LT(spent, absl::Milliseconds(150)) << "the lane thread spun on EMFILE";
  v1::LaneRequest hello = Hello("x");
  std::string frame;
  ASSERT_TRUE(AppendLaneFrame(hello, kLaneMaxFrameBytes, &frame).ok());
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  std::string in;
  char buf[4096];
  absl::StatusOr<LaneFrame> got;
  while (true) {  // answered once accepted (SO_RCVTIMEO bounds the wait)
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << "no answer after descriptors were free again";
    in.append(buf, static_cast<size_t>(n));
    got = NextLaneFrame(in, kLaneMaxFrameBytes);
    ASSERT_TRUE(got.ok()) << got.status();
    if (got->consumed > 0) break;
  }
  v1::LaneResponse r;
  ASSERT_TRUE(ParseLanePayload(got->payload, "LaneResponse", &r).ok());
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated)) << r.message();
  close(fd);
}

}  // namespace
}  // namespace wsync::controller
