// plan::ApplyLinkRateFlags: units, the ranges it accepts, errors naming the
// flag, and a refused list leaving the spec as it was.
#include "controller/plan/link_rate_flags.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::plan {
namespace {

using ::testing::HasSubstr;

TEST(LinkRateFlagsTest, SetsOnlyTheGivenFieldsInBytesAndSeconds) {
  v1::TransferSpec spec;
  spec.mutable_options()->mutable_link_model()->set_nic_bytes_per_second(7);
  ASSERT_TRUE(ApplyLinkRateFlags({{LinkField::kNvlink, "--nv", 300},
                                  {LinkField::kCopy, "--copy", 2.5},
                                  {LinkField::kRoundLatency, "--lat", 20},
                                  {LinkField::kStepLatency, "--step", 4}},
                                 &spec)
                  .ok());
  const v1::LinkModel& lm = spec.options().link_model();
  EXPECT_DOUBLE_EQ(lm.nvlink_bytes_per_second(), 300e9);
  EXPECT_DOUBLE_EQ(lm.local_copy_bytes_per_second(), 2.5e9);
  EXPECT_DOUBLE_EQ(lm.round_latency_seconds(), 20e-6);
  EXPECT_DOUBLE_EQ(lm.step_latency_seconds(), 4e-6);
  EXPECT_DOUBLE_EQ(lm.nic_bytes_per_second(), 7) << "no flag: the field as it was";
  ASSERT_TRUE(ApplyLinkRateFlags({{LinkField::kRoundLatency, "--lat", 0}}, &spec).ok());
  EXPECT_DOUBLE_EQ(spec.options().link_model().round_latency_seconds(), 0);
}

TEST(LinkRateFlagsTest, RefusesOutOfRangeValuesNamingTheFlagAndChangesNothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    LinkField field;
    double value;
  };
  for (const Case& c :
       {Case{LinkField::kNic, 0}, Case{LinkField::kNic, -1}, Case{LinkField::kNvlink, 2e12},
        Case{LinkField::kCopy, nan}, Case{LinkField::kRoundLatency, -0.5},
        Case{LinkField::kStepLatency, -1}, Case{LinkField::kStepLatency, nan}}) {
    v1::TransferSpec spec;
    spec.mutable_options()->mutable_link_model()->set_nvlink_bytes_per_second(5);
    const absl::Status s = ApplyLinkRateFlags(
        {{LinkField::kNvlink, "--first", 1}, {c.field, "--bad-flag", c.value}}, &spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.value;
    EXPECT_THAT(s.message(), HasSubstr("--bad-flag"));
    EXPECT_DOUBLE_EQ(spec.options().link_model().nvlink_bytes_per_second(), 5)
        << "a refused list sets no field";
  }
}

}  // namespace
}  // namespace wsync::plan
