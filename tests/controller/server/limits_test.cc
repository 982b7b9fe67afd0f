// The controller's bounds on what a request can grow (issue 18, item 3):
// bucket size, plan size, deadlines, version jumps, rendezvous quotas.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "controller/server/controller.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

// The coordinator fixture, with the plan limits of `build` and leases that
// outlive a slow plan (nothing heartbeats here).
class LimitsTest : public controller_testing::CoordinatorFixture {
 protected:
  void Start(plan::BuildOptions build = plan::BuildOptions()) {
    config_.lease_ttl = absl::Seconds(30);
    build_ = build;
    Restart();
  }

  // SimpleTransfer's three workers, for a tensor of `elems` fp32 elements.
  void RegisterSimple(int64_t elems) {
    Register("s0", "src", 0, 2, elems * 2);
    Register("s1", "src", 1, 2, elems * 2);
    Register("d0", "dst", 0, 1, elems * 4);
  }

  absl::StatusOr<v1::SyncResponse> StartSync(int64_t version, int64_t deadline_ms = 0) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(version);
    req.set_deadline_ms(deadline_ms);
    return controller_->syncs().StartSync(req);
  }
};

// The 81-byte attack: bucket_bytes 1 on a 4 MiB tensor planned ~1 M buckets
// (2.2 GB kept). Refused before planning, naming the field, limit and flag.
TEST_F(LimitsTest, TinyBucketBytesRefusedBeforePlanning) {
  Start();
  const int64_t elems = 1 << 16;
  RegisterSimple(elems);
  v1::DefineTransferRequest req = controller_testing::SimpleTransfer(elems);
  req.mutable_spec()->mutable_options()->set_bucket_bytes(1);
  const absl::Time start = absl::Now();
  auto resp = controller_->syncs().DefineTransfer(req);
  ASSERT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << resp.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT(std::string(resp.status().message()),
              ::testing::AllOf(HasSubstr("bucket_bytes 1"), HasSubstr("65536"),
                               HasSubstr("--min_bucket_bytes")));
  EXPECT_EQ(plans_->misses(), 0);  // nothing was planned
  // At the minimum it plans.
  req.mutable_spec()->mutable_options()->set_bucket_bytes(config_.limits.min_bucket_bytes);
  EXPECT_TRUE(controller_->syncs().DefineTransfer(req).ok());
}

TEST_F(LimitsTest, PlanOverMaxBucketsRefusedBeforeMapping) {
  plan::BuildOptions build;
  build.max_buckets = 100;
  config_.limits.min_bucket_bytes = 1024;
  Start(build);
  const int64_t elems = 1 << 20;  // 4 MiB: >= 4096 buckets of 1 KiB
  RegisterSimple(elems);
  v1::DefineTransferRequest req = controller_testing::SimpleTransfer(elems);
  req.mutable_spec()->mutable_options()->set_bucket_bytes(1024);
  auto resp = controller_->syncs().DefineTransfer(req);
  ASSERT_EQ(resp.status().code(), absl::StatusCode::kResourceExhausted) << resp.status();
  EXPECT_THAT(std::string(resp.status().message()),
              ::testing::AllOf(HasSubstr("4096 buckets"), HasSubstr("limit of 100"),
                               HasSubstr("--max_plan_buckets")));
  EXPECT_EQ(plans_->cached_plans(), 0u);
}

TEST_F(LimitsTest, PlanOverMaxPiecesRefused) {
  plan::BuildOptions build;
  build.max_pieces = 10;
  Start(build);
  const int64_t elems = 1 << 20;
  RegisterSimple(elems);
  v1::DefineTransferRequest req = controller_testing::SimpleTransfer(elems);
  req.mutable_spec()->mutable_options()->set_bucket_bytes(64 << 10);  // >= 64 pieces
  auto resp = controller_->syncs().DefineTransfer(req);
  ASSERT_EQ(resp.status().code(), absl::StatusCode::kResourceExhausted) << resp.status();
  EXPECT_THAT(std::string(resp.status().message()),
              ::testing::AllOf(HasSubstr("pieces"), HasSubstr("--max_plan_pieces")));
}

TEST_F(LimitsTest, DeadlineOverMaximumRefused) {
  Start();
  RegisterSimple(8);
  ASSERT_TRUE(controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer()).ok());
  auto resp = StartSync(1, std::numeric_limits<int64_t>::max());
  ASSERT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << resp.status();
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("--max_sync_deadline"));
  // The transfer is free for a sync with a sane deadline.
  EXPECT_TRUE(StartSync(1, 60'000).ok());
}

// Sync(version=INT64_MAX) once succeeded and left no newer version: the
// transfer was bricked. Now refused, and version 1 still syncs.
TEST_F(LimitsTest, VersionJumpOverMaximumRefused) {
  Start();
  RegisterSimple(8);
  ASSERT_TRUE(controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer()).ok());
  auto resp = StartSync(std::numeric_limits<int64_t>::max());
  ASSERT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << resp.status();
  EXPECT_THAT(std::string(resp.status().message()),
              ::testing::AllOf(HasSubstr("4294967296"), HasSubstr("--max_version_jump")));
  EXPECT_TRUE(StartSync(int64_t{1} << 32).ok());  // exactly the jump is allowed
}

TEST(RendezvousQuotaTest, ScopeBytesAndKeysAreBounded) {
  Rendezvous kv([](const std::string&) { return true; }, Rendezvous::Quota{1000, 3});
  kv.OpenScope("t", 0, 1, {"l"});
  const std::string prefix = Rendezvous::ScopePrefix("t", 1);
  auto set = [&](const std::string& key, size_t bytes) {
    v1::KvSetRequest req;
    req.set_lease_id("l");
    req.set_key(prefix + key);
    req.set_value(std::string(bytes, 'x'));
    return kv.Set(req);
  };
  ASSERT_TRUE(set("a", 400).ok());
  const absl::Status big = set("b", 600);
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_THAT(std::string(big.message()),
              ::testing::AllOf(HasSubstr("quota of 1000"), HasSubstr("--kv_scope_bytes")));
  ASSERT_TRUE(set("a", 10).ok());  // overwriting frees the old value's bytes
  ASSERT_TRUE(set("b", 600).ok());
  ASSERT_TRUE(set("c", 1).ok());
  const absl::Status keys = set("d", 1);
  EXPECT_EQ(keys.code(), absl::StatusCode::kResourceExhausted) << keys;
  EXPECT_THAT(std::string(keys.message()), HasSubstr("--kv_scope_keys"));
  // The next generation starts empty.
  kv.OpenScope("t", 1, 2, {"l"});
  v1::KvSetRequest next;
  next.set_lease_id("l");
  next.set_key(Rendezvous::ScopePrefix("t", 2) + "a");
  next.set_value(std::string(900, 'x'));
  EXPECT_TRUE(kv.Set(next).ok());
}

}  // namespace
}  // namespace wsync::controller
