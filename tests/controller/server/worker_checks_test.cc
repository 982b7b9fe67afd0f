// worker_checks.h: buffers, common transport and staging limits, on
// hand-made worker snapshots and plans.
#include "controller/server/worker_checks.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "common/bucket_steps.h"
#include "common/plan_pieces.h"
#include "controller/plan/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

WorkerSnapshot Worker(const std::string& name, std::vector<v1::TransportKind> transports,
                      int64_t staging_limit = 0) {
  auto info = std::make_shared<v1::RegisterWorkerRequest>();
  for (v1::TransportKind t : transports) info->add_transports(t);
  info->set_staging_limit_bytes(staging_limit);
  v1::BufferInfo* b = info->add_buffers();
  b->set_group("g");
  b->set_name("w");
  b->set_dtype(v1::FP32);
  b->set_bytes(64);
  WorkerSnapshot s;
  s.lease_id = "L-" + name;
  s.info = std::move(info);
  s.description = "worker " + name;
  return s;
}

TEST(WorkerChecksTest, CommonTransportPrefersNcclAndNamesMixedWorkers) {
  const WorkerSnapshot gpu = Worker("gpu", {v1::TRANSPORT_NCCL});
  const WorkerSnapshot both = Worker("both", {v1::TRANSPORT_NCCL, v1::TRANSPORT_GLOO});
  const WorkerSnapshot host = Worker("host", {});  // none listed: Gloo
  EXPECT_EQ(*CommonTransport("t", {gpu, both}), v1::TRANSPORT_NCCL);
  EXPECT_EQ(*CommonTransport("t", {host, both}), v1::TRANSPORT_GLOO);
  auto mixed = CommonTransport("t", {gpu, host});
  ASSERT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mixed.status().message(), HasSubstr("worker gpu runs the GPU plane (nccl)"));
  EXPECT_THAT(mixed.status().message(), HasSubstr("worker host runs on host memory (gloo)"));
  EXPECT_EQ(TransportName(v1::TRANSPORT_NCCL), "nccl");
  EXPECT_EQ(TransportName(v1::TRANSPORT_GLOO), "gloo");
}

TEST(WorkerChecksTest, NcclWorkersOfDifferentNcclVersionsAreRefusedByName) {
  auto with_nccl = [](const std::string& name, const std::string& version) {
    WorkerSnapshot w = Worker(name, {v1::TRANSPORT_NCCL});
    auto info = std::make_shared<v1::RegisterWorkerRequest>(*w.info);
    info->add_capabilities("cuda_ipc");
    if (!version.empty()) info->add_capabilities("nccl=" + version);
    w.info = std::move(info);
    return w;
  };
  const WorkerSnapshot sidecar = with_nccl("trainer", "2.28.3");
  const WorkerSnapshot embedded = with_nccl("vllm", "2.28.9");
  EXPECT_EQ(*CommonTransport("t", {sidecar, with_nccl("other", "2.28.3")}), v1::TRANSPORT_NCCL);
  // A worker that does not say (an older build) is not held against the others.
  EXPECT_EQ(*CommonTransport("t", {sidecar, with_nccl("old", "")}), v1::TRANSPORT_NCCL);
  auto mixed = CommonTransport("t", {sidecar, embedded});
  ASSERT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mixed.status().message(), HasSubstr("worker trainer runs NCCL 2.28.3"));
  EXPECT_THAT(mixed.status().message(), HasSubstr("worker vllm runs NCCL 2.28.9"));
  EXPECT_THAT(mixed.status().message(), HasSubstr("LD_LIBRARY_PATH"));
}

TEST(WorkerChecksTest, TheTightestLimitLowersTheSpecsCapAndDefaultBucket) {
  const std::vector<WorkerSnapshot> workers = {Worker("a", {}, 0), Worker("b", {}, 5000),
                                               Worker("c", {}, 1 << 20)};
  const StagingLimit limit = TightestStagingLimit(workers);
  EXPECT_EQ(limit.worker, 1);
  EXPECT_EQ(limit.bytes, 5000);
  EXPECT_EQ(limit.cap, 4864) << "rounded down to 256 bytes, as the worker's schedule does";
  EXPECT_EQ(limit.description, "worker b");
  v1::TransferSpec spec;
  ASSERT_TRUE(ApplyStagingLimit(limit, &spec));
  EXPECT_EQ(spec.options().staging_cap_bytes(), 4864);
  EXPECT_EQ(spec.options().bucket_bytes(), 4864);
  // A spec already tighter keeps its own options.
  v1::TransferSpec tight;
  tight.mutable_options()->set_staging_cap_bytes(1024);
  tight.mutable_options()->set_bucket_bytes(512);
  EXPECT_FALSE(ApplyStagingLimit(limit, &tight));
  EXPECT_EQ(tight.options().staging_cap_bytes(), 1024);
  EXPECT_EQ(tight.options().bucket_bytes(), 512);
  // An explicit bucket size stays (the planner refuses it if it cannot fit).
  v1::TransferSpec explicit_bucket;
  explicit_bucket.mutable_options()->set_bucket_bytes(8192);
  ASSERT_TRUE(ApplyStagingLimit(limit, &explicit_bucket));
  EXPECT_EQ(explicit_bucket.options().bucket_bytes(), 8192);
  // No limit anywhere: nothing changes.
  EXPECT_EQ(TightestStagingLimit({Worker("a", {})}).worker, -1);
  EXPECT_FALSE(ApplyStagingLimit(StagingLimit(), &spec));
}

TEST(WorkerChecksTest, AStepLatencyIsClearedUnlessEveryWorkerRunsSteps) {
  auto with_steps = [](const std::string& name) {
    WorkerSnapshot w = Worker(name, {});
    auto info = std::make_shared<v1::RegisterWorkerRequest>(*w.info);
    info->add_capabilities(kBucketStepsCapability);
    w.info = info;
    return w;
  };
  v1::TransferSpec spec;
  spec.mutable_options()->mutable_link_model()->set_step_latency_seconds(10e-6);
  v1::TransferSpec kept = spec;
  EXPECT_EQ(ClearStepsUnlessEveryWorkerRunsThem({with_steps("a"), with_steps("b")}, &kept), -1);
  EXPECT_EQ(kept.options().link_model().step_latency_seconds(), 10e-6);
  v1::TransferSpec cleared = spec;
  EXPECT_EQ(ClearStepsUnlessEveryWorkerRunsThem({with_steps("a"), Worker("old", {})}, &cleared), 1);
  EXPECT_EQ(cleared.options().link_model().step_latency_seconds(), 0);
  // No step latency: nothing to clear, whoever the workers are, and the
  // spec stays as it was (no empty link model added).
  v1::TransferSpec none;
  EXPECT_EQ(ClearStepsUnlessEveryWorkerRunsThem({Worker("old", {})}, &none), -1);
  EXPECT_FALSE(none.options().has_link_model());
  // An invalid latency stays for the planner to refuse, whoever the workers are.
  for (const double bad : {std::nan(""), -1e-6, std::numeric_limits<double>::infinity()}) {
    v1::TransferSpec invalid = spec;
    invalid.mutable_options()->mutable_link_model()->set_step_latency_seconds(bad);
    const std::string before = invalid.SerializeAsString();
    EXPECT_EQ(ClearStepsUnlessEveryWorkerRunsThem({Worker("old", {})}, &invalid), -1) << bad;
    EXPECT_EQ(invalid.SerializeAsString(), before) << bad;
  }
}

TEST(WorkerChecksTest, ARoundOverAWorkersLimitIsRefusedNamingIt) {
  v1::Plan plan;
  plan.set_key("k");
  for (int32_t w = 0; w < 2; ++w) {
    v1::RankPlan* rp = plan.add_ranks();
    rp->set_worker(w);
    v1::Round* round = rp->add_rounds();
    round->set_index(3);
    round->set_staging_bytes(w == 0 ? 512 : 1024);
  }
  EXPECT_TRUE(CheckStagingLimits(plan, {Worker("a", {}, 512), Worker("b", {}, 0)}).ok());
  const absl::Status over = CheckStagingLimits(plan, {Worker("a", {}, 512), Worker("b", {}, 1000)});
  ASSERT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.message(), HasSubstr("worker b [worker 1]: round 3 of plan 'k' stages 1024"));
  EXPECT_THAT(over.message(), HasSubstr("staging limit of 1000 bytes"));
}

TEST(WorkerChecksTest, BuffersMustBeRegisteredLargeEnoughAndOfTheLayoutsDtype) {
  v1::Plan part;
  part.add_names("g/w");
  v1::Bucket* b = part.add_buckets();
  b->set_sender(1);
  b->set_receiver(0);
  v1::Piece* p = b->add_pieces();
  p->mutable_dst()->set_buffer_name(0);
  p->mutable_dst()->set_dtype(v1::FP32);
  p->mutable_dst()->add_shape(16);
  p->mutable_dst()->add_strides(1);
  const WorkerSnapshot w = Worker("a", {});
  EXPECT_TRUE(CheckBuffers(part, 0, w, /*require_all=*/true).ok());
  p->mutable_dst()->set_byte_offset(4);
  absl::Status st = CheckBuffers(part, 0, w, true);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("has 64 bytes but the plan accesses up to byte 68"));
  p->mutable_dst()->set_byte_offset(0);
  p->mutable_dst()->set_dtype(v1::BF16);
  st = CheckBuffers(part, 0, w, true);
  EXPECT_THAT(st.message(), HasSubstr("registered as"));
  part.set_names(0, "h/w");
  p->mutable_dst()->set_dtype(v1::FP32);
  EXPECT_EQ(CheckBuffers(part, 0, w, true).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckBuffers(part, 0, w, false).ok()) << "group h has no buffers yet";
}

// A run's members are checked one by one: the buffer (64 bytes) holds the
// first two members of 4 floats at a stride of 24 bytes, not the third
// (bytes 48..64 fit; a step of 28 puts it at 56..72).
TEST(WorkerChecksTest, EveryMemberOfAPieceRunMustFitItsBuffer) {
  v1::Plan part;
  part.add_names("g/w");
  v1::Bucket* b = part.add_buckets();
  b->set_id(3);
  b->set_sender(1);
  b->set_receiver(0);
  b->set_bytes(48);
  v1::PieceRun* run = b->add_runs();
  v1::Piece* f = run->mutable_first();
  f->set_wire_dtype(v1::FP32);
  for (v1::TensorView* v : {f->mutable_src(), f->mutable_dst()}) {
    v->set_dtype(v1::FP32);
    v->add_shape(4);
    v->add_strides(1);
  }
  run->set_count(3);
  run->set_dst_byte_step(24);
  run->set_bucket_step(16);
  const WorkerSnapshot w = Worker("a", {});
  EXPECT_TRUE(CheckBuffers(part, 0, w, /*require_all=*/true).ok());
  run->set_dst_byte_step(28);
  absl::Status st = CheckBuffers(part, 0, w, true);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("has 64 bytes but the plan accesses up to byte 72"));
  run->set_count(1);  // a hostile run: refused naming bucket and run
  st = CheckBuffers(part, 0, w, true);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("bucket 3 run 0"));
}

// `part` (which needs no buffer) is refused to a worker without `capability`,
// naming the worker and the capability, and accepted once it registers it.
void ExpectOnlyWorkersWithTheCapabilityGetIt(const v1::Plan& part, const char* capability) {
  WorkerSnapshot w = Worker("old", {});
  absl::Status st = CheckBuffers(part, 0, w, /*require_all=*/true);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), HasSubstr("worker old [worker 0]"));
  EXPECT_THAT(st.message(), HasSubstr(capability));
  auto info = std::make_shared<v1::RegisterWorkerRequest>(*w.info);
  info->add_capabilities(capability);
  w.info = info;
  st = CheckBuffers(part, 0, w, /*require_all=*/true);
  EXPECT_TRUE(st.ok()) << st;
}

// Rows of piece runs (stacked plans) go only to workers that read them: an
// older worker would write each run's first row and leave the others.
TEST(WorkerChecksTest, RowsOfPieceRunsNeedTheCapability) {
  v1::Plan part;
  part.set_key("k");
  part.add_names("g/w");
  v1::Bucket* b = part.add_buckets();
  b->set_id(3);
  b->set_sender(1);
  b->set_receiver(0);
  b->set_bytes(64);
  v1::PieceRun* run = b->add_runs();
  v1::Piece* f = run->mutable_first();
  f->set_wire_dtype(v1::FP32);
  for (v1::TensorView* v : {f->mutable_src(), f->mutable_dst()}) {
    v->set_dtype(v1::FP32);
    v->add_shape(2);
    v->add_strides(1);
  }
  run->set_count(2);
  run->set_dst_byte_step(8);
  run->set_bucket_step(8);
  run->set_outer_count(2);
  run->set_outer_dst_byte_step(16);
  run->set_outer_bucket_step(16);
  ExpectOnlyWorkersWithTheCapabilityGetIt(part, kPieceRunRowsCapability);
  run->set_outer_count(0);  // one row: any worker reads it
  EXPECT_TRUE(CheckBuffers(part, 0, Worker("old", {}), true).ok());
}

// A part with steps inside rounds goes only to a worker that runs them in
// order (an older one would relay bytes before they arrived).
TEST(WorkerChecksTest, StepsInsideRoundsNeedTheCapability) {
  v1::Plan part;
  part.set_key("k");
  v1::Bucket* b = part.add_buckets();
  b->set_id(0);
  b->set_sender(1);
  b->set_receiver(0);
  b->set_step(2);
  ExpectOnlyWorkersWithTheCapabilityGetIt(part, kBucketStepsCapability);
  b->set_step(0);  // no steps: any worker runs it
  EXPECT_TRUE(CheckBuffers(part, 0, Worker("old", {}), true).ok());
}

}  // namespace
}  // namespace wsync::controller
