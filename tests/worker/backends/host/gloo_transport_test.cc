#include "worker/backends/host/gloo_transport.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/plane/transport_conformance.h"
#include "tests/worker/plane/transport_steps_conformance.h"
#include "worker/plane/kv_store.h"

namespace wsync::transport {
namespace {

using conformance::TransportConformanceTest;
using conformance::TransportTestFactory;

std::string UniquePrefix() {
  static std::atomic<int> counter{0};
  return absl::StrCat("test/", getpid(), "/", counter++);
}

// Creates every rank concurrently (rendezvous needs all of them).
absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGlooGroup(
    KvStore* store, int size, absl::Duration timeout = absl::Seconds(30)) {
  const std::string prefix = UniquePrefix();
  std::vector<absl::Status> status(size);
  std::vector<std::unique_ptr<Transport>> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooTransportOptions o;
      o.rank = r;
      o.size = size;
      o.store = store;
      o.prefix = prefix;
      o.connect_timeout = timeout;
      auto made = GlooTransport::Create(o);
      status[r] = made.status();
      if (made.ok()) out[r] = std::move(*made);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    if (!status[r].ok()) return status[r];
  }
  return out;
}

class GlooFactory : public TransportTestFactory {
 public:
  std::string Name() const override { return "Gloo"; }
  int max_group_size() const override { return 8; }
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGroup(int size) override {
    return CreateGlooGroup(&store_, size);
  }

 private:
  InMemoryKvStore store_;
};

INSTANTIATE_TEST_SUITE_P(Gloo, TransportConformanceTest,
                         ::testing::Values(std::make_shared<GlooFactory>()),
                         TransportConformanceTest::ParamName);

TEST(GlooTransportTest, AbsentPeerAtRendezvousNamesIt) {
  InMemoryKvStore store;
  GlooTransportOptions o;
  o.rank = 0;
  o.size = 3;
  o.store = &store;
  o.prefix = UniquePrefix();
  o.connect_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto t = GlooTransport::Create(o);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_NE(t.status().message().find("peer rank 1 did not publish its address"),
            std::string::npos)
      << t.status();
}

TEST(GlooTransportTest, RejectsBadOptions) {
  InMemoryKvStore store;
  GlooTransportOptions o;
  o.store = &store;
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(GlooTransport::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.store = nullptr;
  EXPECT_EQ(GlooTransport::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooTransportTest, SingleRankGroupRunsEmptyRounds) {
  InMemoryKvStore store;
  auto group = CreateGlooGroup(&store, 1);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_TRUE((*group)[0]->RunRound({}, {}, absl::Now() + absl::Seconds(1)).ok());
}

// A peer whose transport is destroyed mid-round: the survivor fails within
// its deadline, naming the peer, instead of hanging.
TEST(GlooTransportTest, DestroyedPeerFailsRoundNamingIt) {
  InMemoryKvStore store;
  auto group = CreateGlooGroup(&store, 2);
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<uint8_t> buf(1 << 20);
  absl::Status status;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {
    RecvRequest q{1, 1, buf.data(), buf.size()};
    status = (*group)[0]->RunRound({}, {&q, 1}, absl::Now() + absl::Seconds(3));
  });
  absl::SleepFor(absl::Milliseconds(200));
  (*group)[1].reset();
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
  EXPECT_NE(status.message().find("peer 1"), std::string::npos) << status;
}

// Two processes rendezvous through a FileKvStore and exchange 8 MiB both ways.
TEST(GlooTransportTest, TwoProcessesOverFileStore) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("wsync_kv_", getpid())).string();
  std::filesystem::create_directories(dir);
  constexpr size_t kBytes = 8 << 20;
  auto run = [&](int rank) -> absl::Status {
    FileKvStore store(dir);
    GlooTransportOptions o;
    o.rank = rank;
    o.size = 2;
    o.store = &store;
    o.prefix = "two_procs";
    o.connect_timeout = absl::Seconds(30);
    auto t = GlooTransport::Create(o);
    if (!t.ok()) return t.status();
    std::vector<uint8_t> out(kBytes), in(kBytes);
    for (size_t i = 0; i < kBytes; ++i) out[i] = static_cast<uint8_t>(i * 131 + rank);
    SendRequest s{1 - rank, 0, out.data(), kBytes};
    RecvRequest q{1 - rank, 0, in.data(), kBytes};
    absl::Status st = (*t)->RunRound({&s, 1}, {&q, 1}, absl::Now() + absl::Seconds(30));
    if (!st.ok()) return st;
    for (size_t i = 0; i < kBytes; ++i) {
      if (in[i] != static_cast<uint8_t>(i * 131 + (1 - rank))) {
        return absl::DataLossError(absl::StrCat("rank ", rank, " byte ", i));
      }
    }
    return absl::OkStatus();
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(run(1).ok() ? 0 : 1);
  const absl::Status parent = run(0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(parent.ok()) << parent;
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

}  // namespace
}  // namespace wsync::transport
