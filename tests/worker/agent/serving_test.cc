// ServingTable: the owner's SetServing requests as the agent keeps and
// reports them (validation, one report per group, the change flag).
#include "worker/agent/serving.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

using ::testing::HasSubstr;

std::vector<v1::Membership> Groups() {
  std::vector<v1::Membership> ms(2);
  ms[0].set_group("trainer");
  ms[0].set_rank(1);
  ms[0].set_group_size(2);
  ms[1].set_group("inference");
  ms[1].set_rank(0);
  ms[1].set_group_size(2);
  return ms;
}

v1::SetServingRequest Req(const std::string& group, int64_t version, v1::ServingState state) {
  v1::SetServingRequest r;
  r.set_group(group);
  r.set_version(version);
  r.set_state(state);
  r.set_replica("srv-0");
  r.set_replica_ranks(2);
  return r;
}

TEST(ServingTableTest, KeepsTheLatestStatePerGroupAndFlagsChanges) {
  ServingTable t(Groups());
  EXPECT_FALSE(t.TakeChanged());
  EXPECT_TRUE(t.Reports(0).empty());
  ASSERT_TRUE(t.Set(Req("inference", 3, v1::SERVING_STATE_UPDATING)).ok());
  ASSERT_TRUE(t.Set(Req("inference", 3, v1::SERVING_STATE_SERVING)).ok());
  EXPECT_TRUE(t.TakeChanged());
  EXPECT_FALSE(t.TakeChanged());
  std::vector<v1::ServingReport> r = t.Reports(/*last_synced_version=*/3);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].group(), "inference");
  EXPECT_EQ(r[0].version(), 3);
  EXPECT_EQ(r[0].state(), v1::SERVING_STATE_SERVING);
  EXPECT_EQ(r[0].replica(), "srv-0");
  EXPECT_EQ(r[0].replica_ranks(), 2);
  EXPECT_EQ(r[0].last_synced_version(), 3);
  EXPECT_GT(r[0].set_unix_ms(), 0);
  ASSERT_TRUE(t.Set(Req("trainer", 4, v1::SERVING_STATE_PAUSED)).ok());
  EXPECT_EQ(t.Reports(4).size(), 2u);
}

TEST(ServingTableTest, RefusesWhatItCannotReport) {
  ServingTable t(Groups());
  absl::Status s = t.Set(Req("other", 1, v1::SERVING_STATE_SERVING));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("group 'other'"));
  EXPECT_THAT(s.message(), HasSubstr("'trainer', 'inference'"));
  s = t.Set(Req("inference", 1, v1::SERVING_STATE_UNSPECIFIED));
  EXPECT_THAT(s.message(), HasSubstr("not one of serving"));
  s = t.Set(Req("inference", 1, static_cast<v1::ServingState>(17)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = t.Set(Req("inference", -2, v1::SERVING_STATE_SERVING));
  EXPECT_THAT(s.message(), HasSubstr("version -2"));
  v1::SetServingRequest bad = Req("inference", 1, v1::SERVING_STATE_SERVING);
  bad.set_replica_ranks(-1);
  EXPECT_THAT(t.Set(bad).message(), HasSubstr("replica_ranks -1"));
  EXPECT_FALSE(t.TakeChanged());
  EXPECT_TRUE(t.Reports(0).empty());
}

}  // namespace
}  // namespace wsync::agent
