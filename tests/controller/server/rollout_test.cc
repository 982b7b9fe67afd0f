// The pure parts of rolling waves (controller/server/rollout.h): policy
// checks, replica grouping, the wave scheduler and the staleness rule.
#include "controller/server/rollout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using P = ReplicaPhase;

TEST(RolloutTest, GroupsByRankBlocksOrByLabelsOrderedByLowestRank) {
  std::vector<RolloutMember> members = {{0, 3, "x"}, {1, 0, "y"}, {2, 2, "x"}, {3, 1, ""}};
  std::vector<RolloutReplica> blocks = GroupReplicas(members, 2);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].label, "ranks-0-1");
  EXPECT_THAT(blocks[0].ranks, ElementsAre(0, 1));
  EXPECT_THAT(blocks[0].parts, ElementsAre(1, 3));
  EXPECT_EQ(blocks[1].label, "ranks-2-3");
  std::vector<RolloutReplica> labelled = GroupReplicas(members, 0);
  ASSERT_EQ(labelled.size(), 3u);
  EXPECT_EQ(labelled[0].label, "y");
  EXPECT_EQ(labelled[1].label, "");  // the unlabelled ranks together
  EXPECT_EQ(labelled[2].label, "x");
  EXPECT_THAT(labelled[2].ranks, ElementsAre(2, 3));
}

TEST(RolloutTest, NextWaveWaitsForTheCommittingOneThenTakesAtMostMaxUnavailable) {
  EXPECT_THAT(NextWave({P::kWaiting, P::kWaiting, P::kWaiting}, 2), ElementsAre(0, 1));
  EXPECT_TRUE(NextWave({P::kDone, P::kCommitting, P::kWaiting}, 2).empty());
  EXPECT_THAT(NextWave({P::kDone, P::kDone, P::kWaiting, P::kWaiting}, 1), ElementsAre(2));
  EXPECT_THAT(NextWave({P::kWaiting, P::kDone, P::kWaiting}, 0), ElementsAre(0, 2));
  EXPECT_TRUE(NextWave({P::kDone, P::kDone}, 1).empty());
  EXPECT_EQ(WavesLeft({P::kCommitting, P::kWaiting, P::kWaiting, P::kWaiting}, 2), 3);
  EXPECT_EQ(WavesLeft({P::kWaiting, P::kWaiting, P::kWaiting}, 0), 1);
  EXPECT_EQ(WavesLeft({P::kDone}, 1), 0);
}

TEST(RolloutTest, PolicyChecksNameTheFieldAndRefuseWavesInPlace) {
  v1::RolloutPolicy p;
  EXPECT_TRUE(CheckRolloutPolicy("t", p, v1::STAGING_IN_PLACE).ok());
  p.set_max_unavailable(1);
  absl::Status st = CheckRolloutPolicy("t", p, v1::STAGING_IN_PLACE);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("needs a staged transfer"));
  EXPECT_TRUE(CheckRolloutPolicy("t", p, v1::STAGING_DEVICE_SHADOW).ok());
  p.set_replica_ranks(kMaxRolloutValue + 1);
  EXPECT_THAT(CheckRolloutPolicy("t", p, v1::STAGING_DEVICE_SHADOW).message(),
              HasSubstr("rollout.replica_ranks"));
}

TEST(RolloutTest, StalenessNamesEveryReplicaTooFarBehindAndIgnoresUnknownOnes) {
  std::vector<v1::ReplicaVersion> rs(3);
  rs[0].set_replica("a");
  rs[0].add_ranks(0);
  rs[0].set_version(5);
  rs[1].set_replica("b");
  rs[1].add_ranks(1);
  rs[1].set_version(3);
  rs[1].set_state("uncommitted");
  rs[2].set_replica("c");
  rs[2].set_version(0);  // unknown
  EXPECT_TRUE(CheckStaleness("t", 6, 5, 0, rs).ok()) << "0: no bound";
  EXPECT_TRUE(CheckStaleness("t", 6, 5, 3, rs).ok());
  absl::Status st = CheckStaleness("t", 6, 5, 2, rs);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("replica 'b' (ranks 1) serves version 3"));
  EXPECT_THAT(st.message(), HasSubstr("resend version 5"));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("'a'")));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("'c'")));
}

}  // namespace
}  // namespace wsync::controller
