// Every planner validation error: the code, and that the message names the
// tensor (and rank / box where there is one). Never a crash, never a plan.
#include <limits>

#include "controller/plan/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::TransferSpec Base() {
  v1::Side src = Side("trainer", Range(0, 2));
  v1::Side dst = Side("infer", Range(10, 2));
  Mesh(&src, "w", {4, 4}, {2}, {Sh(0)});
  Mesh(&dst, "w", {4, 4}, {2}, {Sh(1)});
  return Spec(src, dst);
}

void ExpectError(const v1::TransferSpec& spec, absl::StatusCode code,
                 const std::vector<std::string>& parts) {
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), code) << plan.status();
  for (const std::string& p : parts)
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(p));
}

TEST(PlannerValidationTest, BaseIsValid) { EXPECT_TRUE(BuildPlan(Base()).ok()); }

TEST(PlannerValidationTest, DtypeMismatchWithoutCast) {
  v1::TransferSpec spec = Base();
  spec.mutable_destination()->mutable_tensors(0)->set_dtype(v1::BF16);
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'w'", "fp32", "bf16", "allowed_casts"});
  AllowCast(&spec, v1::FP32, v1::BF16);
  EXPECT_TRUE(BuildPlan(spec).ok());
}

TEST(PlannerValidationTest, Fp16ToBf16IsNeverReinterpreted) {
  v1::TransferSpec spec = Base();
  spec.mutable_source()->mutable_tensors(0)->set_dtype(v1::FP16);
  spec.mutable_destination()->mutable_tensors(0)->set_dtype(v1::BF16);
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'w'", "fp16", "bf16"});
}

TEST(PlannerValidationTest, IntegerFloatNeverCast) {
  v1::TransferSpec spec = Base();
  spec.mutable_destination()->mutable_tensors(0)->set_dtype(v1::INT32);
  AllowCast(&spec, v1::FP32, v1::INT32);
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'w'", "int32"});
}

TEST(PlannerValidationTest, IdentityShapeMismatch) {
  v1::TransferSpec spec = Base();
  spec.mutable_destination()->mutable_tensors(0)->set_shape(1, 6);
  ExpectError(spec, absl::StatusCode::kInvalidArgument,
              {"shape mismatch", "'w'", "[4, 4]", "[4, 6]"});
}

TEST(PlannerValidationTest, UnknownTensors) {
  v1::TransferSpec spec = Base();
  Mesh(spec.mutable_destination(), "extra", {4}, {2}, {Rep()});
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'extra'", "no source tensor"});
  spec = Base();
  Map(&spec, "w", {0, 0}, "nope", {0, 0}, {4, 4});
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"unknown source tensor 'nope'"});
  spec = Base();
  Map(&spec, "nope", {0, 0}, "w", {0, 0}, {4, 4});
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"unknown destination tensor 'nope'"});
}

TEST(PlannerValidationTest, MappingBoxesOutOfRange) {
  v1::TransferSpec spec = Base();
  Map(&spec, "w", {0, 0}, "w", {2, 0}, {4, 4});
  ExpectError(spec, absl::StatusCode::kInvalidArgument,
              {"mapping 0", "'w'", "[2:6, 0:4]", "out of range"});
  spec = Base();
  Map(&spec, "w", {1, 0}, "w", {0, 0}, {4, 4});
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'w'", "[1:5, 0:4]", "out of range"});
  spec = Base();
  Map(&spec, "w", {0}, "w", {0, 0}, {4, 4});
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'w'", "dst_offset"});
}

TEST(PlannerValidationTest, OverlappingMappings) {
  v1::TransferSpec spec = Base();
  Map(&spec, "w", {0, 0}, "w", {0, 0}, {3, 4});
  Map(&spec, "w", {2, 0}, "w", {0, 0}, {2, 4});
  ExpectError(spec, absl::StatusCode::kInvalidArgument,
              {"'w'", "[0:3, 0:4]", "[2:4, 0:4]", "overlap"});
}

TEST(PlannerValidationTest, DestinationElementsNotMapped) {
  v1::TransferSpec spec = Base();
  Map(&spec, "w", {0, 0}, "w", {0, 0}, {3, 4});  // row 3 fed by nothing
  ExpectError(spec, absl::StatusCode::kInvalidArgument, {"'w'", "rank", "fed by no mapping"});
}

TEST(PlannerValidationTest, DestinationElementsHeldByNoSource) {
  v1::Side src = Side("trainer", Range(0, 2));
  v1::Side dst = Side("infer", Range(10, 1));
  v1::TensorLayout* t = Explicit(&src, "w", {4, 4});
  Frag(t, 0, {0, 0}, {2, 4});
  Frag(t, 1, {3, 0}, {1, 4});  // row 2 held by nobody
  Mesh(&dst, "w", {4, 4}, {1}, {Rep()});
  ExpectError(Spec(src, dst), absl::StatusCode::kInvalidArgument,
              {"destination tensor 'w'", "rank 0", "worker 10", "[2:3, 0:4]", "held by no source"});
}

TEST(PlannerValidationTest, EmptySides) {
  v1::TransferSpec spec = Base();
  spec.mutable_destination()->clear_tensors();
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  spec = Base();
  spec.mutable_source()->clear_ranks();
  plan = BuildPlan(spec);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlannerValidationTest, BucketLargerThanStagingCap) {
  v1::TransferSpec spec = Base();
  spec.mutable_options()->set_bucket_bytes(4096);
  spec.mutable_options()->set_staging_cap_bytes(1024);
  ExpectError(spec, absl::StatusCode::kInvalidArgument,
              {"bucket_bytes (4096)", "staging_cap_bytes (1024)"});
}

// A rate so low (or not finite) that a link's seconds overflow would leave
// round assignment with infinite loads: refused, naming the field.
TEST(PlannerValidationTest, LinkRatesAndLatencyMustBeFinite) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double rate : {-1.0, 1e-300, 0.5, inf, nan}) {
    v1::TransferSpec spec = Base();
    spec.mutable_options()->mutable_link_model()->set_nic_bytes_per_second(rate);
    ExpectError(spec, absl::StatusCode::kInvalidArgument,
                {"options.link_model", rate < 0 ? "negative" : "at least 1 byte/s"});
    spec = Base();
    spec.mutable_options()->mutable_link_model()->set_nvlink_bytes_per_second(rate);
    ExpectError(spec, absl::StatusCode::kInvalidArgument, {"options.link_model"});
  }
  for (double latency : {inf, nan}) {
    v1::TransferSpec spec = Base();
    spec.mutable_options()->mutable_link_model()->set_round_latency_seconds(latency);
    ExpectError(spec, absl::StatusCode::kInvalidArgument, {"round_latency_seconds"});
    spec = Base();
    spec.mutable_options()->mutable_link_model()->set_step_latency_seconds(latency);
    ExpectError(spec, absl::StatusCode::kInvalidArgument, {"step_latency_seconds"});
  }
  {
    v1::TransferSpec spec = Base();
    spec.mutable_options()->mutable_link_model()->set_step_latency_seconds(-1e-6);
    ExpectError(spec, absl::StatusCode::kInvalidArgument, {"options.link_model", "negative"});
  }
  v1::TransferSpec spec = Base();
  spec.mutable_options()->mutable_link_model()->set_nic_bytes_per_second(1);  // slow, finite
  EXPECT_TRUE(BuildPlan(spec).ok());
}

TEST(PlannerValidationTest, WorkerOnTwoNodes) {
  v1::Side src = Side("trainer", {0, 1}, 1);
  v1::Side dst = Side("infer", {1}, 0);
  dst.mutable_ranks(0)->set_node("elsewhere");
  Mesh(&src, "w", {4}, {2}, {Sh(0)});
  Mesh(&dst, "w", {4}, {1}, {Rep()});
  ExpectError(Spec(src, dst), absl::StatusCode::kInvalidArgument, {"worker 1", "elsewhere"});
}

TEST(PlannerValidationTest, PartialGroupWithMixedBoxes) {
  v1::Side src = Side("trainer", Range(0, 2));
  v1::Side dst = Side("infer", Range(10, 1));
  v1::TensorLayout* t = Explicit(&src, "w", {4});
  Frag(t, 0, {0}, {4})->set_partial_group(1);
  Frag(t, 1, {0}, {2})->set_partial_group(1);
  Mesh(&dst, "w", {4}, {1}, {Rep()});
  absl::StatusOr<v1::Plan> plan = BuildPlan(Spec(src, dst));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("partial_group 1"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("w"));
}

}  // namespace
}  // namespace wsync::plan
