// The replay oracle reads piece runs (common/plan_pieces.h): a real plan
// whose buckets were rewritten into runs replays exactly like the same plan
// with its runs written out, and hostile runs are refused naming bucket and
// run before anything is replayed.
#include <limits>
#include <string>

#include "common/plan_pieces.h"
#include "controller/plan/planner.h"
#include "controller/verify/replay.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/plan_runs_util.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using ::testing::HasSubstr;

struct Compacted {
  v1::TransferSpec spec;
  v1::Plan plan;  // with runs
};

// 6 alike tensors, row-sharded over 2 trainer ranks, column-sharded over
// 2 inference ranks: each (sender, receiver) bucket packs the 6 tensors'
// pieces alike but for names and offsets, so the compactor makes runs.
Compacted CompactedSpec() {
  using planner_testing::Mesh;
  using planner_testing::Range;
  using planner_testing::Sh;
  v1::Side src = planner_testing::Side("trainer", Range(0, 2));
  v1::Side dst = planner_testing::Side("infer", Range(2, 2));
  for (int t = 0; t < 6; ++t) {
    const std::string name = "layer" + std::to_string(t);
    Mesh(&src, name, {8, 16}, {2}, {Sh(0)});
    Mesh(&dst, name, {8, 16}, {2}, {Sh(1)});
  }
  Compacted c{planner_testing::Spec(src, dst), {}};
  BuildOptions build;
  build.emit_piece_runs = false;  // the compactor's runs, not the planner's
  absl::StatusOr<v1::Plan> plan = BuildPlan(c.spec, build);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) c.plan = *plan;
  EXPECT_GT(wsync::testing::CompactRuns(&c.plan), 0) << "no bucket has a run";
  return c;
}

// The first bucket with a run.
int BucketWithRun(const v1::Plan& plan) {
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.runs_size() > 0) return static_cast<int>(b.id());
  }
  return -1;
}

absl::StatusOr<HostMemory> Replayed(const v1::TransferSpec& spec, const v1::Plan& plan) {
  absl::StatusOr<CompiledSide> src = CompileSide(spec.source(), SideRole::kSource);
  absl::StatusOr<CompiledSide> dst = CompileSide(spec.destination(), SideRole::kDestination);
  if (!src.ok()) return src.status();
  if (!dst.ok()) return dst.status();
  HostMemory mem;
  if (absl::Status s = AllocateBuffers(*src, *dst, &mem); !s.ok()) return s;
  if (absl::Status s = FillSource(*src, 1000, &mem); !s.ok()) return s;
  if (absl::Status s = ReplayPlan(plan, &mem); !s.ok()) return s;
  return mem;
}

TEST(ReplayRunsTest, APlanWithRunsReplaysLikeItsRunsWrittenOut) {
  Compacted c = CompactedSpec();
  int64_t pieces = 0;
  for (const v1::Bucket& b : c.plan.buckets()) pieces += *PieceCount(b);
  // The summary's count is of pieces, every member of a run counted.
  EXPECT_EQ(pieces, c.plan.summary().num_pieces());
  ASSERT_TRUE(CheckPlanRuns(c.plan).ok());
  // Every destination element right (with the runs ignored, the members'
  // destinations would keep their zeros).
  absl::Status verified = VerifyPlan(c.spec, c.plan);
  EXPECT_TRUE(verified.ok()) << verified;
  absl::StatusOr<HostMemory> with_runs = Replayed(c.spec, c.plan);
  absl::StatusOr<HostMemory> written_out = Replayed(c.spec, ExpandPlanRuns(c.plan));
  ASSERT_TRUE(with_runs.ok()) << with_runs.status();
  ASSERT_TRUE(written_out.ok()) << written_out.status();
  EXPECT_TRUE(with_runs->buffers() == written_out->buffers());
}

TEST(ReplayRunsTest, HostileRunsAreRefusedNamingBucketAndRun) {
  const Compacted c = CompactedSpec();
  const int b = BucketWithRun(c.plan);
  ASSERT_GE(b, 0);
  const std::string where = "bucket " + std::to_string(b) + " run 0";
  struct Case {
    const char* what;
    void (*edit)(v1::PieceRun*, v1::Bucket*);
    const char* says;
  };
  const Case cases[] = {
      {"one member", [](v1::PieceRun* r, v1::Bucket*) { r->set_count(1); }, "count 1"},
      {"2^31 - 1 members", [](v1::PieceRun* r, v1::Bucket*) { r->set_count(0x7fffffff); },
       "more than"},
      {"last name out of range",
       [](v1::PieceRun* r, v1::Bucket*) { r->set_tensor_name_step(1 << 20); }, "tensor_name"},
      {"negative byte offsets",
       [](v1::PieceRun* r, v1::Bucket*) {
         r->set_dst_byte_step(std::numeric_limits<int64_t>::min());
       },
       "dst.byte_offset"},
      {"members overlap", [](v1::PieceRun* r, v1::Bucket*) { r->set_bucket_step(1); }, "overlap"},
      {"past the bucket", [](v1::PieceRun* r, v1::Bucket* bk) { r->set_bucket_step(bk->bytes()); },
       "last member"},
      {"a reduce input", [](v1::PieceRun* r, v1::Bucket*) { r->mutable_first()->set_reduce_id(1); },
       "reduce"},
  };
  for (const Case& k : cases) {
    v1::Plan plan = c.plan;
    v1::Bucket* bk = plan.mutable_buckets(b);
    k.edit(bk->mutable_runs(0), bk);
    HostMemory mem;
    absl::Status s = ReplayPlan(plan, &mem);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(where)) << k.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(k.says)) << k.what;
  }
}

// A run well-formed on its own whose members land on a plain piece's bytes:
// the structure check sees the written-out members and refuses.
TEST(ReplayRunsTest, ARunOverlappingAPlainPieceIsRefused) {
  Compacted c = CompactedSpec();
  const int b = BucketWithRun(c.plan);
  ASSERT_GE(b, 0);
  v1::Bucket* bk = c.plan.mutable_buckets(b);
  *bk->add_pieces() = bk->runs(0).first();  // the first member's bytes, twice
  absl::Status s = VerifyPlan(c.spec, c.plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlap"));
}

}  // namespace
}  // namespace wsync::plan
