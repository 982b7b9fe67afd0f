// The pipelined executor under a staging limit (never exceeded; a round over
// it refused) and its transport messages (runs of staged buckets with one
// peer as one message), over Gloo on loopback.
#include "tests/worker/exec/pipelined_fixture.h"

namespace wsync::exec::testing {
namespace {

// A staging limit between one and two rounds' worth: never exceeded, some
// neighbours still overlap, every byte right.
TEST_F(PipelinedExecutorTest, StagingLimitIsNeverExceeded) {
  PlanGen g(23);
  const v1::Plan plan = MakePlan(g);
  // The largest worker's rounds decide the limit; every worker gets it.
  int64_t limit = 0, unlimited_bytes = 0;
  {
    Cluster probe(kWorkers);
    for (int w = 0; w < kWorkers; ++w) {
      probe.Add(w, BufferSide::kSource, absl::StrCat("s", w), v1::FP32, kSrcNumel);
      probe.Add(w, BufferSide::kDestination, absl::StrCat("d", w), v1::FP32, kDstNumel);
    }
    for (int w = 0; w < kWorkers; ++w) {
      auto b = BindPlan(plan, w, probe.registry(w), MemorySpace::kHost);
      ASSERT_TRUE(b.ok()) << b.status();
      // 1.5 rounds' worth of the largest round, in whole 256-byte units.
      limit = std::max(limit, ((*b)->max_staging_bytes + 255) / 256 * 256 * 3 / 2 / 256 * 256);
      auto unlimited = BuildPipelineSchedule(**b);
      ASSERT_TRUE(unlimited.ok());
      unlimited_bytes = std::max(unlimited_bytes, unlimited->staging_bytes);
    }
  }
  ASSERT_GT(unlimited_bytes, limit) << "the limit would bind nothing";
  ExecutorOptions o;
  o.staging_limit_bytes = limit;
  SetUpCluster(o);
  ClearDestinations();
  std::vector<int64_t> sampled;
  auto out = RunSampled(plan, &sampled);
  int overlapped = 0;
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(out[w].ok()) << "worker " << w << ": " << out[w].status();
    EXPECT_LE(out[w]->peak_staging_bytes, limit) << "worker " << w;
    EXPECT_LE(sampled[w], limit) << "worker " << w;
    EXPECT_LE(cluster_.executor(w).allocated_staging_bytes(), limit) << "worker " << w;
    overlapped += out[w]->rounds_packed_ahead + out[w]->rounds_finished_async;
  }
  EXPECT_GT(overlapped, 0) << "the limit left no room to overlap anything";
  CheckDestinations(g);
}

TEST_F(PipelinedExecutorTest, RoundOverTheStagingLimitIsRefused) {
  PlanGen g(29);
  const v1::Plan plan = MakePlan(g);
  ExecutorOptions o;
  o.staging_limit_bytes = 256;  // below any round of this plan
  SetUpCluster(o);
  auto out = cluster_.Run(plan, absl::Seconds(30));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_FALSE(out[w].ok()) << "worker " << w;
    EXPECT_EQ(out[w].status().code(), absl::StatusCode::kInvalidArgument) << out[w].status();
    EXPECT_NE(out[w].status().message().find("staging limit"), std::string::npos)
        << out[w].status();
  }
}

// Consecutive staged buckets with one peer travel as one message while each
// bucket before the next is a multiple of 64 bytes; zero-copy buckets and
// odd sizes end a run. Every element still lands right.
TEST_F(PipelinedExecutorTest, RunsOfStagedBucketsWithOnePeerGoAsOneMessage) {
  PlanGen g(17);
  for (int w = 0; w < kWorkers; ++w) {
    const int v = (w + 1) % kWorkers;
    g.Bucket(w, v, 0, false, {g.Fresh(w, v, 64, 1)});  // 256 B  } one message
    g.Bucket(w, v, 0, false, {g.Fresh(w, v, 32, 2)});  // 128 B  }
    g.Bucket(w, v, 0, true, {g.Fresh(w, v, 64, 1)});   // zero-copy: its own
    g.Bucket(w, v, 0, false, {g.Fresh(w, v, 16, 1)});  // 64 B   } one message
    g.Bucket(w, v, 0, false, {g.Fresh(w, v, 5, 1)});   // 20 B   }
    g.Bucket(w, v, 0, false, {g.Fresh(w, v, 16, 1)});  // after 20 B: its own
  }
  const v1::Plan plan = g.Build(1);
  SetUpCluster({});
  ClearDestinations();
  auto out = cluster_.Run(plan, absl::Seconds(60));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(out[w].ok()) << "worker " << w << ": " << out[w].status();
    ASSERT_EQ(out[w]->rounds.size(), 1u);
    EXPECT_EQ(out[w]->rounds[0].sends, 6);
    EXPECT_EQ(out[w]->rounds[0].recvs, 6);
    EXPECT_EQ(out[w]->rounds[0].messages, 8) << "worker " << w;
  }
  CheckDestinations(g);
}

}  // namespace
}  // namespace wsync::exec::testing
