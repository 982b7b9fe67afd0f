// Connecting a Gloo mesh to a peer that dies or stalls after publishing its
// addresses (issue 18 leftovers, item 2): every live rank fails within the
// deadline (not 5x it, as Gloo's connectFullMesh did), naming the peer; an
// abort ends connecting at once.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backends/host/gloo_transport.h"
#include "worker/plane/kv_store.h"

namespace wsync::transport {
namespace {

using ::testing::HasSubstr;

constexpr int kSize = 4;
constexpr int kFaulty = kSize - 1;  // every live rank reaches it last

// A FileKvStore that raises `sig` in this process at its first Get after
// the process published a pair address (a value of >= 100 bytes: Gloo's
// TCP address is a sockaddr_storage and more; other keys hold host names):
// SIGKILL is a peer killed before connecting, SIGSTOP one frozen there.
class DyingStore : public FileKvStore {
 public:
  DyingStore(std::string dir, int sig) : FileKvStore(std::move(dir)), sig_(sig) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    published_ = published_ || value.size() >= 100;
    return FileKvStore::Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) override {
    if (published_) raise(sig_);
    return FileKvStore::Get(key, deadline);
  }

 private:
  const int sig_;
  bool published_ = false;
};

class GlooConnectTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            absl::StrCat("wsync_gloo_connect_", getpid(), "_", GetParam()))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (child_ > 0) {
      kill(child_, SIGKILL);
      waitpid(child_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  GlooTransportOptions Options(int rank, KvStore* store) const {
    GlooTransportOptions o;
    o.rank = rank;
    o.size = kSize;
    o.store = store;
    o.prefix = "mesh";
    return o;
  }

  // Forks the faulty rank (before any thread of this process starts); it
  // rendezvouses with the live ranks and hits its signal once it published
  // its addresses.
  void StartFaultyPeer() {
    child_ = fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      DyingStore store(dir_, GetParam());
      GlooTransportOptions o = Options(kFaulty, &store);
      o.deadline = absl::Now() + absl::Seconds(30);
      (void)GlooTransport::Create(o);
      _exit(0);
    }
  }

  // The faulty rank was killed or stopped as planned (not just timed out).
  void ExpectFaultHit() {
    int wstatus = 0;
    ASSERT_EQ(waitpid(child_, &wstatus, WUNTRACED), child_);
    EXPECT_TRUE(WIFSIGNALED(wstatus) || WIFSTOPPED(wstatus)) << "status " << wstatus;
    if (WIFSIGNALED(wstatus)) child_ = -1;
  }

  // Connects ranks 0..kSize-2 concurrently; their results and durations.
  std::vector<absl::Status> ConnectLiveRanks(absl::Time deadline, std::atomic<bool>* cancel,
                                             std::vector<absl::Duration>* took) {
    std::vector<absl::Status> status(kFaulty);
    took->assign(kFaulty, absl::ZeroDuration());
    std::vector<std::thread> threads;
    for (int r = 0; r < kFaulty; ++r) {
      threads.emplace_back([&, r] {
        FileKvStore store(dir_);
        GlooTransportOptions o = Options(r, &store);
        o.deadline = deadline;
        o.cancel = cancel;
        const absl::Time start = absl::Now();
        status[r] = GlooTransport::Create(o).status();
        (*took)[r] = absl::Now() - start;
      });
    }
    for (auto& t : threads) t.join();
    return status;
  }

  // A killed peer fails every live rank (refused, or never connecting back);
  // a stopped one's listening sockets still complete a TCP connect, so a
  // rank that initiates its pair may succeed (its rounds then time out).
  void ExpectFailedNamingThePeer(const absl::Status& status, int rank) const {
    if (GetParam() == SIGSTOP && status.ok()) return;
    EXPECT_FALSE(status.ok()) << "rank " << rank;
    EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("peer rank ", kFaulty)))
        << "rank " << rank;
  }

  std::string dir_;
  pid_t child_ = -1;
};

TEST_P(GlooConnectTest, EveryLiveRankFailsWithinTheDeadlineNamingThePeer) {
  StartFaultyPeer();
  const absl::Duration budget = absl::Seconds(2);
  std::vector<absl::Duration> took;
  std::vector<absl::Status> status = ConnectLiveRanks(absl::Now() + budget, nullptr, &took);
  ExpectFaultHit();
  int naming_the_faulty = 0;
  for (int r = 0; r < kFaulty; ++r) {
    // The deadline, plus the watchdog's poll and a loaded machine's slack;
    // Gloo's own wait was 5x the budget (10 s).
    EXPECT_LT(took[r], budget + absl::Seconds(1)) << "rank " << r << ": " << status[r];
    const std::string message(status[r].message());
    if (GetParam() == SIGKILL || message.find("Connection closed by peer") == std::string::npos) {
      ExpectFailedNamingThePeer(status[r], r);
    } else {
      // A stopped peer: a live rank that reached its own deadline first
      // closes its pairs, and a rank still connecting to it names that rank
      // (seen once in a fresh-clone CI run on 2 loaded cores). It still
      // fails in time; the stopped peer is named by the rank that timed out.
      EXPECT_FALSE(status[r].ok()) << "rank " << r;
    }
    if (message.find(absl::StrCat("peer rank ", kFaulty)) != std::string::npos) ++naming_the_faulty;
  }
  if (GetParam() == SIGKILL) {
    EXPECT_EQ(naming_the_faulty, kFaulty);
  } else if (std::any_of(status.begin(), status.end(),
                         [](const absl::Status& s) { return !s.ok(); })) {
    // Whichever rank failed first timed out on the stopped peer.
    EXPECT_GE(naming_the_faulty, 1) << "no live rank named the stopped peer";
  }
}

TEST_P(GlooConnectTest, AnAbortEndsConnectingAtOnce) {
  StartFaultyPeer();
  std::atomic<bool> cancel{false};
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancel.store(true);
  });
  std::vector<absl::Duration> took;
  std::vector<absl::Status> status =
      ConnectLiveRanks(absl::Now() + absl::Seconds(20), &cancel, &took);
  aborter.join();
  ExpectFaultHit();
  for (int r = 0; r < kFaulty; ++r) {
    // Which peer a rank names depends on which of its pairs fails first
    // once every rank stops connecting (a peer that gave up stops serving
    // its side). What matters: every rank stops at once.
    if (GetParam() == SIGKILL) EXPECT_FALSE(status[r].ok()) << "rank " << r;
    EXPECT_LT(took[r], absl::Seconds(3)) << "rank " << r << ": " << status[r];
  }
}

INSTANTIATE_TEST_SUITE_P(KilledOrStopped, GlooConnectTest, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGKILL ? "Killed" : "Stopped");
                         });

}  // namespace
}  // namespace wsync::transport
