// Staged syncs through the SyncRunner (docs/staging.md), one worker copying
// locally (no transport): what a commit may touch in the live tensors, and
// who stages.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/worker/exec/plan_builder.h"
#include "worker/agent/sync_runner.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

using exec::testing::Piece;
using exec::testing::PlanBuilder;
using exec::testing::View;

class StagedRunnerTest : public ::testing::Test {
 protected:
  StagedRunnerTest() {
    std::vector<LocalTensor> list;
    for (auto* t : {&src_, &other_, &dst_}) {
      LocalTensor l;
      l.reg.set_name(t == &src_ ? "src" : t == &other_ ? "other" : "dst");
      l.reg.set_dtype(v1::FP32);
      l.reg.add_shape(16);
      l.data = t->data();
      l.bytes = 64;
      list.push_back(std::move(l));
    }
    EXPECT_TRUE(tensors_.RegisterLocal("g", std::move(list), false).ok());
  }

  // g/<from>[elements first, +count) -> g/dst[same], each range one piece.
  static v1::Plan Copies(const std::string& key, const std::string& from,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    std::vector<v1::Piece> pieces;
    for (auto [first, count] : ranges) {
      pieces.push_back(Piece(View("g/" + from, first * 4, {count}, v1::FP32),
                             View("g/dst", first * 4, {count}, v1::FP32), v1::FP32));
    }
    PlanBuilder b;
    b.AddBucket(0, 0, 0, pieces);
    return b.Build(key);
  }

  v1::ReportResultRequest Run(const std::string& sync_id, const v1::Plan& plan, bool staged) {
    v1::SyncAssignment a;
    a.set_sync_id(sync_id);
    a.set_transfer(plan.key());
    a.set_version(++version_);
    a.set_plan_key(plan.key());
    a.set_worker(0);
    a.set_part_key(plan.key() + "/0");
    a.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Seconds(10)));
    *a.mutable_plan() = plan;
    if (staged) a.mutable_staging()->set_mode(v1::STAGING_HOST_SHADOW);
    return runner_.Run(a, nullptr, "lease", nullptr);
  }

  host::HostBackend backend_{plane::BackendConfig()};
  TensorTable tensors_{{"g"}, &backend_};
  SyncRunner runner_{&tensors_, nullptr, RunnerOptions{absl::Seconds(10), 0, &backend_}};
  std::vector<float> src_ = std::vector<float>(16, 1), other_ = std::vector<float>(16, 2),
                     dst_ = std::vector<float>(16, 0);
  int64_t version_ = 0;
};

// Review finding (issue 20): a reused shadow copied whole reverted the bytes
// an in-place sync of another transfer wrote in between.
TEST_F(StagedRunnerTest, ACommitKeepsWhatAnInPlaceSyncOfAnotherTransferWroteInBetween) {
  const v1::Plan staged = Copies("a", "src", {{0, 4}, {12, 4}});  // extent: all 16
  v1::ReportResultRequest r = Run("a1", staged, /*staged=*/true);
  ASSERT_EQ(r.code(), 0) << r.message();
  ASSERT_TRUE(r.staged());
  ASSERT_TRUE(runner_.CommitStaged("s").ok());
  EXPECT_EQ(dst_[0], 1);
  EXPECT_EQ(dst_[6], 0);

  r = Run("b1", Copies("b", "other", {{4, 8}}), /*staged=*/false);  // in place, the gap
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(dst_[6], 2);

  std::fill(src_.begin(), src_.end(), 3.0f);
  r = Run("a2", staged, /*staged=*/true);  // the same shadow again
  ASSERT_EQ(r.code(), 0) << r.message();
  ASSERT_TRUE(r.staged());
  EXPECT_EQ(dst_[0], 1) << "staged: the live tensor still serves the old version";
  ASSERT_TRUE(runner_.CommitStaged("s").ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(dst_[i], i < 4 || i >= 12 ? 3 : 2) << "element " << i;
  }
}

// Review finding (issue 20): the worker staged when its views were all
// empty, the controller (no shadow bytes) did not: one shared predicate.
TEST_F(StagedRunnerTest, AReceiverWhoseViewsAreAllEmptyDoesNotStage) {
  const v1::ReportResultRequest r = Run("e1", Copies("e", "src", {{3, 0}, {8, 0}}), true);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_FALSE(r.staged()) << "the controller expects no staged report from it";
  EXPECT_EQ(r.shadow_bytes(), 0);
}

}  // namespace
}  // namespace wsync::agent
