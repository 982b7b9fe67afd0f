// Rendezvous: key-value scopes per transfer generation, with a real
// WorkerRegistry deciding which leases are alive.
#include "controller/server/rendezvous.h"

#include <thread>

#include "absl/time/clock.h"
#include "controller/server/worker_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RendezvousTest : public ::testing::Test {
 protected:
  RendezvousTest()
      : registry_(Config(), nullptr),
        kv_([this](const std::string& lease) { return registry_.IsAlive(lease); }) {
    registry_.SetLossListener([this](const WorkerLoss&) { kv_.WakeAll(); });
    v1::RegisterWorkerRequest req;
    req.set_instance_id("a");
    auto* m = req.add_memberships();
    m->set_group("src");
    m->set_rank(0);
    m->set_group_size(1);
    lease_ = registry_.RegisterWorker(req)->lease_id();
  }

  static ControllerConfig Config() {
    ControllerConfig c;
    c.instance = "test";
    c.lease_ttl = absl::Seconds(30);
    return c;
  }

  v1::KvSetRequest Set(const std::string& key, const std::string& value) {
    v1::KvSetRequest req;
    req.set_lease_id(lease_);
    req.set_key(key);
    req.set_value(value);
    return req;
  }

  v1::KvGetRequest Get(std::vector<std::string> keys, int64_t timeout_ms) {
    v1::KvGetRequest req;
    req.set_lease_id(lease_);
    for (const std::string& k : keys) req.add_keys(k);
    req.set_timeout_ms(timeout_ms);
    return req;
  }

  WorkerRegistry registry_;
  Rendezvous kv_;
  std::string lease_;
};

TEST_F(RendezvousTest, KeysLiveInTheirGenerationsScope) {
  EXPECT_EQ(Rendezvous::ScopePrefix("t", 1), "t/1/");
  EXPECT_EQ(kv_.Set(Set("t/1/rank0", "x")).code(), absl::StatusCode::kFailedPrecondition)
      << "no scope is open yet";
  kv_.OpenScope("t", 0, 1, {lease_});
  ASSERT_TRUE(kv_.Set(Set("t/1/rank0", "addr0")).ok());
  EXPECT_EQ(kv_.Set(Set("t/2/rank0", "x")).code(), absl::StatusCode::kFailedPrecondition);
  auto got = kv_.Get(Get({"t/1/rank0"}, 0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->values(), ElementsAre("addr0"));
  kv_.OpenScope("t", 1, 2, {lease_});
  EXPECT_EQ(kv_.Get(Get({"t/1/rank0"}, 0)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(kv_.Get(Get({"t/2/rank0"}, 0)).status().code(), absl::StatusCode::kDeadlineExceeded)
      << "the new scope starts empty";
}

TEST_F(RendezvousTest, GetWaitsForEveryKeyOrNamesTheMissingOnes) {
  kv_.OpenScope("t", 0, 1, {lease_});
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(kv_.Set(Set("t/1/b", "vb")).ok());
  });
  ASSERT_TRUE(kv_.Set(Set("t/1/a", "va")).ok());
  auto got = kv_.Get(Get({"t/1/a", "t/1/b"}, 5000));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->values(), ElementsAre("va", "vb"));
  auto missing = kv_.Get(Get({"t/1/a", "t/1/c"}, 30));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(), HasSubstr("t/1/c"));
  EXPECT_THAT(missing.status().message(), ::testing::Not(HasSubstr("t/1/a")));
}

TEST_F(RendezvousTest, AWaitingGetEndsWhenItsScopeEnds) {
  kv_.OpenScope("t", 0, 1, {lease_});
  std::thread opener([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv_.OpenScope("t", 1, 2, {lease_});
  });
  const absl::Time t0 = absl::Now();
  auto got = kv_.Get(Get({"t/1/never"}, 10000));
  opener.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

TEST_F(RendezvousTest, ALostLeaseIsRefusedAndItsWaitingGetEnds) {
  kv_.OpenScope("t", 0, 1, {lease_});
  auto token = registry_.OpenStream(lease_);
  ASSERT_TRUE(token.ok());
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    registry_.CloseStream(lease_, *token, "killed");
  });
  const absl::Time t0 = absl::Now();
  auto got = kv_.Get(Get({"t/1/never"}, 10000));
  closer.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(kv_.Set(Set("t/1/a", "x")).code(), absl::StatusCode::kNotFound);
}

TEST_F(RendezvousTest, ShutdownEndsWaits) {
  kv_.OpenScope("t", 0, 1, {lease_});
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv_.Shutdown();
  });
  auto got = kv_.Get(Get({"t/1/never"}, 10000));
  stopper.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
}

// Issue 18: a rogue worker (a live lease of another group) overwrote keys in
// a live scope. Only the generation's workers may set or read its keys.
TEST_F(RendezvousTest, OnlyTheGenerationsWorkersMaySetOrGetItsKeys) {
  v1::RegisterWorkerRequest req;
  req.set_instance_id("rogue");
  auto* m = req.add_memberships();
  m->set_group("made-up");
  m->set_rank(0);
  m->set_group_size(1);
  auto rogue = registry_.RegisterWorker(req);
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  kv_.OpenScope("t", 0, 1, {lease_});
  ASSERT_TRUE(kv_.Set(Set("t/1/rank0", "addr0")).ok());

  v1::KvSetRequest forged = Set("t/1/rank0", "attacker");
  forged.set_lease_id(rogue->lease_id());
  absl::Status set = kv_.Set(forged);
  EXPECT_EQ(set.code(), absl::StatusCode::kPermissionDenied) << set;
  EXPECT_THAT(set.message(), HasSubstr("t/1/"));
  v1::KvGetRequest peek = Get({"t/1/rank0"}, 0);
  peek.set_lease_id(rogue->lease_id());
  EXPECT_EQ(kv_.Get(peek).status().code(), absl::StatusCode::kPermissionDenied);

  auto got = kv_.Get(Get({"t/1/rank0"}, 0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->values(), ElementsAre("addr0")) << "the worker's value stands";
}

}  // namespace
}  // namespace wsync::controller
