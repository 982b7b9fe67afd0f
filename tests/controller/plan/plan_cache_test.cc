#include "controller/plan/plan_cache.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

v1::TransferSpec MakeSpec(int64_t bucket_bytes) {
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(10, 2));
  Mesh(&src, "w", {8, 8}, {4}, {Sh(0)});
  Mesh(&dst, "w", {8, 8}, {2}, {Sh(1)});
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(bucket_bytes);
  return spec;
}

TEST(PlanCacheTest, HitMissAndEviction) {
  PlanCache cache(2);
  auto a = cache.GetOrBuild(MakeSpec(1024));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(cache.misses(), 1);
  auto a2 = cache.GetOrBuild(MakeSpec(1024));
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a->get(), a2->get());  // same shared plan
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.Lookup((*a)->key()).get(), a->get());
  ASSERT_TRUE(cache.GetOrBuild(MakeSpec(2048)).ok());
  ASSERT_TRUE(cache.GetOrBuild(MakeSpec(4096)).ok());
  EXPECT_EQ(cache.misses(), 3);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Lookup((*a)->key()), nullptr);  // evicted, still alive for holders
  EXPECT_EQ((*a)->key(), PlanKey(MakeSpec(1024)));
}

TEST(PlanCacheTest, ErrorsAreNotCached) {
  PlanCache cache;
  v1::TransferSpec bad = MakeSpec(1024);
  bad.mutable_destination()->mutable_tensors(0)->set_dtype(v1::BF16);
  EXPECT_FALSE(cache.GetOrBuild(bad).ok());
  EXPECT_FALSE(cache.GetOrBuild(bad).ok());
  EXPECT_EQ(cache.misses(), 2);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(PlanCacheTest, ConcurrentCallersShareOneBuild) {
  PlanCache cache;
  const v1::TransferSpec spec = MakeSpec(512);
  std::vector<std::thread> threads;
  std::vector<const v1::Plan*> got(8, nullptr);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto p = cache.GetOrBuild(spec);
      if (p.ok()) got[i] = p->get();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 7);
  for (const v1::Plan* p : got) EXPECT_EQ(p, got[0]);
}

// The cache is bounded by the bytes its plans occupy, not only their count.
TEST(PlanCacheTest, ByteBudgetEvictsOldestAndKeepsNewest) {
  PlanCache unbounded(16);
  auto first = unbounded.GetOrBuild(MakeSpec(1024));
  ASSERT_TRUE(first.ok());
  const int64_t one = unbounded.bytes();
  // Honest footprint: at least the plan's own in-memory size.
  EXPECT_GE(one, static_cast<int64_t>((*first)->SpaceUsedLong()));
  ASSERT_TRUE(unbounded.GetOrBuild(MakeSpec(2048)).ok());
  EXPECT_GT(unbounded.bytes(), one);

  PlanCache cache(16, /*budget_bytes=*/one + one / 2);
  ASSERT_TRUE(cache.GetOrBuild(MakeSpec(1024)).ok());
  auto second = cache.GetOrBuild(MakeSpec(2048));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_LE(cache.bytes(), one + one / 2);
  EXPECT_EQ(cache.Lookup(PlanKey(MakeSpec(1024))), nullptr);
  EXPECT_EQ(cache.Lookup((*second)->key()).get(), second->get());

  // A plan over the whole budget is still kept, alone.
  PlanCache tiny(16, /*budget_bytes=*/1);
  ASSERT_TRUE(tiny.GetOrBuild(MakeSpec(1024)).ok());
  ASSERT_TRUE(tiny.GetOrBuild(MakeSpec(2048)).ok());
  EXPECT_EQ(tiny.size(), 1u);
  EXPECT_NE(tiny.Lookup(PlanKey(MakeSpec(2048))), nullptr);
}

TEST(PlanCacheTest, BuildLimitsApply) {
  BuildOptions build;
  build.max_buckets = 1;
  PlanCache cache(16, 0, build);
  auto plan = cache.GetOrBuild(MakeSpec(64));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_NE(plan.status().message().find("--max_plan_buckets"), std::string::npos);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace wsync::plan
