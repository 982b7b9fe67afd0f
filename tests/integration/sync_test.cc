// End-to-end syncs through the real controller and worker binaries over the
// Gloo host transport: every destination byte is checked.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bucket_steps.h"
#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace wsync::integration {
namespace {

void RunVersions(CaseRun& run, int versions, v1::PlanSummary* summary,
                 int32_t* direct_pairs = nullptr) {
  v1::DefineTransferResponse defined;
  grpc::Status s = run.Define("t", &defined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  if (summary != nullptr) *summary = defined.summary();
  for (int v = 1; v <= versions; ++v) {
    run.Fill(v);
    v1::SyncStatus st;
    v1::SyncResponse started;
    s = run.SyncAndWait("t", v, &st, 0, &started);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
    EXPECT_EQ(st.workers_done(), st.workers_total());
    EXPECT_EQ(st.version(), v);
    if (direct_pairs != nullptr) *direct_pairs = st.direct_pairs();
    EXPECT_TRUE(started.plan_cache_hit()) << "DefineTransfer planned already";
    std::string first;
    EXPECT_EQ(run.Verify(v, &first), 0) << "version " << v << ": " << first;
  }
}

// Fills version `v`, syncs transfer `name` to it and checks that it
// succeeded with every destination byte right.
void SyncVerified(CaseRun& run, const std::string& name, int v, v1::SyncStatus* st) {
  SCOPED_TRACE(absl::StrCat(name, " v", v));
  run.Fill(v);
  grpc::Status s = run.SyncAndWait(name, v, st);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  std::string first;
  EXPECT_EQ(run.Verify(v, &first), 0) << first;
}

TEST(SyncIntegration, FsdpToVllmTpWithFusedQkvAndGateUp) {
  auto run = CaseRun::Start(Case("fsdp:4", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  v1::PlanSummary summary;
  RunVersions(**run, 3, &summary);
  EXPECT_GT(summary.network_bytes(), 0);
  // Unchanged layouts were planned once.
  v1::GetStatusRequest req;
  v1::GetStatusResponse status;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return (*run)->cluster->trainer().GetStatus(c, req, &status);
              }).ok());
  EXPECT_EQ(status.plan_cache_misses(), 1);
  EXPECT_GE(status.plan_cache_hits(), 3);
  ASSERT_EQ(status.transfers_size(), 1);
  EXPECT_EQ(status.transfers(0).last_success_version(), 3);
}

// Workers send their --staging_limit_bytes at registration: the plan's
// rounds fit it (more rounds than without), and the bytes arrive.
TEST(SyncIntegration, TheWorkersStagingLimitCapsThePlan) {
  v1::PlanSummary unlimited;
  {
    auto run = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
    ASSERT_TRUE(run.ok()) << run.status();
    RunVersions(**run, 1, &unlimited);
  }
  demo::ClusterOptions options = DefaultClusterOptions();
  constexpr int64_t kLimit = 64 << 10;
  options.worker_flags.push_back(absl::StrCat("--staging_limit_bytes=", kLimit));
  auto run = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run.ok()) << run.status();
  v1::PlanSummary limited;
  RunVersions(**run, 2, &limited);
  ASSERT_GT(unlimited.peak_staging_bytes(), kLimit) << "the case must need the cap";
  EXPECT_LE(limited.peak_staging_bytes(), kLimit);
  EXPECT_GT(limited.num_rounds(), unlimited.num_rounds());
}

TEST(SyncIntegration, ColocatedGroupsCopyLocally) {
  auto run =
      CaseRun::Start(Case("fsdp:2", "vllm-tp:2", /*colocated=*/true), DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->cluster->num_workers(), 2);  // each worker is in both groups
  v1::PlanSummary summary;
  RunVersions(**run, 2, &summary);
  EXPECT_GT(summary.local_bytes(), 0) << "self-copies expected";
}

// Workers of one host share /dev/shm: by default the senders write the
// receivers' shm tensors directly (the transport carries only tokens); with
// --direct_writes=false every bucket goes through Gloo. Same bytes either way.
TEST(SyncIntegration, DirectWritesAndTheTransportDeliverTheSameBytes) {
  for (const bool direct : {true, false}) {
    for (const auto& [src, dst, colocated] : {std::make_tuple("fsdp:2", "vllm-tp:2", true),
                                              std::make_tuple("fsdp:4", "vllm-tp:2", false)}) {
      SCOPED_TRACE(absl::StrCat(src, " -> ", dst, colocated ? " colocated" : "",
                                direct ? ", direct writes" : ", transport only"));
      demo::ClusterOptions o = DefaultClusterOptions();
      o.worker_flags.push_back(absl::StrCat("--direct_writes=", direct ? "true" : "false"));
      auto run = CaseRun::Start(Case(src, dst, colocated), o);
      ASSERT_TRUE(run.ok()) << run.status();
      int32_t pairs = -1;
      RunVersions(**run, 2, nullptr, &pairs);
      if (direct) {
        EXPECT_GT(pairs, 0);
      } else {
        EXPECT_EQ(pairs, 0);
      }
    }
  }
}

// Two transfers over the same workers, synced in turn with direct writes:
// from the second round on, every assignment marks its peer lists unchanged
// (sent once per transfer), and the workers write with the mappings they
// kept. Every destination byte is checked after each sync.
TEST(SyncIntegration, TwoTransfersTakeTurnsWithDirectWrites) {
  auto run = CaseRun::Start(Case("fsdp:4", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  for (const char* name : {"a", "b"}) {
    grpc::Status s = (*run)->Define(name);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int v = 1; v <= 3; ++v) {
    for (const char* name : {"a", "b"}) {
      v1::SyncStatus st;
      ASSERT_NO_FATAL_FAILURE(SyncVerified(**run, name, v, &st));
      EXPECT_GT(st.direct_pairs(), 0);
    }
  }
}

// Issue 18 leftovers: workers whose part cache (--parts_cache_bytes) holds
// one op list at a time. Three transfers with different plans (bucket
// sizes) take turns: each assignment's part evicts the others, the workers
// report the evicted keys, and the controller sends each part again when it
// is used next. Every sync succeeds with every destination byte checked.
TEST(SyncIntegration, ATinyPartsCacheStillSyncsEveryTransfer) {
  demo::ClusterOptions o = DefaultClusterOptions();
  o.worker_flags.push_back("--parts_cache_bytes=1");
  auto run = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), o);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<std::pair<std::string, int64_t>> transfers = {
      {"a", int64_t{64} << 10}, {"b", int64_t{128} << 10}, {"c", int64_t{1} << 20}};
  for (const auto& [name, bucket] : transfers) {
    (*run)->spec.mutable_options()->set_bucket_bytes(bucket);
    grpc::Status s = (*run)->Define(name);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int v = 1; v <= 3; ++v) {
    for (const auto& [name, bucket] : transfers) {
      v1::SyncStatus st;
      ASSERT_NO_FATAL_FAILURE(SyncVerified(**run, name, v, &st));
    }
  }
}

TEST(SyncIntegration, FanOutToTwoInferenceReplicas) {
  auto run = CaseRun::Start(Case("fsdp:2", "vllm-tp:2x2"), DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  RunVersions(**run, 2, nullptr);
}

// Steps inside rounds through the real controller and workers: slow links
// (the workers share one node, NVLink priced at 100 MB/s) and a step priced
// at a fifth of a round, so the planner relays the replicas' chunks within
// one round (Bucket.step); the workers register the capability, the
// controller hands them their parts with steps, and every destination byte
// is checked.
TEST(SyncIntegration, FanOutRelaysWithinOneRound) {
  auto run = CaseRun::Start(Case("fsdp:1", "vllm-tp:1x4"), DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  v1::LinkModel* lm = (*run)->spec.mutable_options()->mutable_link_model();
  lm->set_nvlink_bytes_per_second(1e8);
  lm->set_step_latency_seconds(10e-6);
  // The controller's spec: every rank on the workers' node (--node=local).
  v1::TransferSpec as_bound = (*run)->spec;
  for (v1::Side* side : {as_bound.mutable_source(), as_bound.mutable_destination()}) {
    for (v1::RankInfo& r : *side->mutable_ranks()) r.set_node("local");
  }
  absl::StatusOr<v1::Plan> plan = plan::BuildPlan(as_bound);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(HasBucketSteps(*plan)) << "the planner made no step";
  v1::PlanSummary summary;
  RunVersions(**run, 2, &summary);
  EXPECT_GT(summary.num_relay_pieces(), 0);
  EXPECT_EQ(summary.num_rounds(), plan->num_rounds());
}

TEST(SyncIntegration, MegatronToSingleRank) {
  auto run = CaseRun::Start(Case("megatron:tp2,pp1,dp1", "vllm-tp:1"), DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  RunVersions(**run, 2, nullptr);
}

// vLLM fp8 serving through the real controller and workers: FSDP row
// shards cut the blocks of the tiny model's weights (receiver-side
// quantization on one replica, fp8 + scales relayed to the other), and every
// fp8 byte and scale is checked against the reference quantizer.
TEST(SyncIntegration, BlockFp8ServingToTwoReplicas) {
  catalog::CaseOptions co = Case("fsdp:2", "vllm-tp:1x2");
  co.fp8_block = true;
  auto run = CaseRun::Start(co, DefaultClusterOptions());
  ASSERT_TRUE(run.ok()) << run.status();
  v1::PlanSummary summary;
  RunVersions(**run, 2, &summary);
  EXPECT_GT(summary.num_quantizes(), 0);
  EXPECT_GT(summary.num_relay_pieces(), 0);
}

// A spec the controller's piece limit refuses unstacked (138 source shards
// over --max_plan_pieces=100) is planned stacked (the experts of each EP
// rank as one tensor, written back as runs: plan_stacking.h) and synced by
// the real workers, every destination byte checked.
TEST(SyncIntegration, StackedExpertsOverThePieceLimitSync) {
  catalog::CaseOptions co = Case("fsdp:2", "vllm-tp:2x2,ep");
  co.model = "tiny-qwen3-moe";
  demo::ClusterOptions o = DefaultClusterOptions();
  o.controller_flags.push_back("--max_plan_pieces=100");
  auto run = CaseRun::Start(co, o);
  ASSERT_TRUE(run.ok()) << run.status();
  v1::PlanSummary summary;
  RunVersions(**run, 2, &summary);
  EXPECT_GT(summary.num_pieces(), 100);  // expanded; the plan holds at most 100 records
}

// With --plan_stacking=off the same spec is refused when it is defined,
// naming the limit.
TEST(SyncIntegration, PlanStackingOffRefusesASpecOverThePieceLimit) {
  catalog::CaseOptions co = Case("fsdp:2", "vllm-tp:2x2,ep");
  co.model = "tiny-qwen3-moe";
  demo::ClusterOptions o = DefaultClusterOptions();
  o.controller_flags.push_back("--max_plan_pieces=100");
  o.controller_flags.push_back("--plan_stacking=off");
  auto run = CaseRun::Start(co, o);
  ASSERT_TRUE(run.ok()) << run.status();
  const grpc::Status s = (*run)->Define("t");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("max_plan_pieces"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace wsync::integration
