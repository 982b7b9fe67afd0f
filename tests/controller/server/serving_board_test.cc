// ServingBoard on its own: per-replica aggregation of the owners' serving
// reports (mixed versions across ranks, states, lost and silent ranks,
// labels, expected sizes) and the validation of reports.
#include "controller/server/serving_board.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

google::protobuf::RepeatedPtrField<v1::Membership> Member(const std::string& group, int rank,
                                                          int size) {
  google::protobuf::RepeatedPtrField<v1::Membership> ms;
  v1::Membership* m = ms.Add();
  m->set_group(group);
  m->set_rank(rank);
  m->set_group_size(size);
  return ms;
}

google::protobuf::RepeatedPtrField<v1::ServingReport> Report(const std::string& group,
                                                             int64_t version,
                                                             v1::ServingState state,
                                                             const std::string& replica = "",
                                                             int replica_ranks = 0) {
  google::protobuf::RepeatedPtrField<v1::ServingReport> rs;
  v1::ServingReport* r = rs.Add();
  r->set_group(group);
  r->set_version(version);
  r->set_state(state);
  r->set_replica(replica);
  r->set_replica_ranks(replica_ranks);
  r->set_last_synced_version(version);
  return rs;
}

// Group "inf" of `size` ranks, rank r held by lease "L<r>".
GroupHolders Holders(int size) {
  GroupHolders h;
  h.size = size;
  for (int r = 0; r < size; ++r) h.leases.push_back("L" + std::to_string(r));
  return h;
}

class ServingBoardTest : public ::testing::Test {
 protected:
  void Set(int rank, int size, int64_t version, v1::ServingState state,
           const std::string& replica = "", int replica_ranks = 0, absl::Time at = kT0) {
    ASSERT_TRUE(board_
                    .Record("L" + std::to_string(rank), Member("inf", rank, size),
                            Report("inf", version, state, replica, replica_ranks), at)
                    .ok());
  }
  const v1::ReplicaServing* Find(const v1::ReplicasResponse& r, const std::string& label) {
    for (const auto& rep : r.replicas()) {
      if (rep.replica() == label) return &rep;
    }
    ADD_FAILURE() << "no replica '" << label << "' in " << r.ShortDebugString();
    return nullptr;
  }

  ServingBoard board_{nullptr, absl::Minutes(10)};
};

TEST_F(ServingBoardTest, UnlabelledGroupServesOnlyWhenEveryRankServesOneVersion) {
  Set(0, 2, 7, v1::SERVING_STATE_SERVING);
  v1::ReplicasResponse r = board_.Replicas("inf", Holders(2), kT0);
  ASSERT_EQ(r.replicas_size(), 1);
  // Rank 1 is live but has reported nothing: the replica is incomplete.
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_INCOMPLETE);
  EXPECT_EQ(r.replicas(0).version(), 0);
  EXPECT_EQ(r.replicas(0).expected_ranks(), 2);
  EXPECT_FALSE(r.replicas(0).ranks(1).reported());
  EXPECT_TRUE(r.replicas(0).ranks(1).live());

  Set(1, 2, 6, v1::SERVING_STATE_SERVING);
  r = board_.Replicas("inf", Holders(2), kT0);
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_MIXED);
  EXPECT_EQ(r.replicas(0).version(), 0);
  EXPECT_EQ(r.replicas(0).last_synced_version(), 6);

  Set(1, 2, 7, v1::SERVING_STATE_SERVING);
  r = board_.Replicas("inf", Holders(2), kT0 + absl::Milliseconds(250));
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_SERVING);
  EXPECT_EQ(r.replicas(0).version(), 7);
  EXPECT_EQ(r.replicas(0).ranks(0).ms_since_report(), 250);
}

TEST_F(ServingBoardTest, StatesRankFailedOverUpdatingOverPaused) {
  Set(0, 3, 4, v1::SERVING_STATE_SERVING);
  Set(1, 3, 4, v1::SERVING_STATE_PAUSED);
  Set(2, 3, 4, v1::SERVING_STATE_SERVING);
  EXPECT_EQ(board_.Replicas("inf", Holders(3), kT0).replicas(0).state(), v1::REPLICA_PAUSED);
  Set(2, 3, 4, v1::SERVING_STATE_UPDATING);
  EXPECT_EQ(board_.Replicas("inf", Holders(3), kT0).replicas(0).state(), v1::REPLICA_UPDATING);
  Set(0, 3, 4, v1::SERVING_STATE_FAILED);
  v1::ReplicasResponse r = board_.Replicas("inf", Holders(3), kT0);
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_FAILED);
  EXPECT_EQ(r.replicas(0).version(), 0);
  EXPECT_EQ(r.replicas(0).ranks(0).state(), v1::SERVING_STATE_FAILED);
}

TEST_F(ServingBoardTest, LabelledReplicasAreJudgedApart) {
  // Two TP=2 servers in one group: "a" = ranks 0-1 at v5, "b" = ranks 2-3
  // with rank 3 still at v4.
  Set(0, 4, 5, v1::SERVING_STATE_SERVING, "a", 2);
  Set(1, 4, 5, v1::SERVING_STATE_SERVING, "a", 2);
  Set(2, 4, 5, v1::SERVING_STATE_SERVING, "b", 2);
  Set(3, 4, 4, v1::SERVING_STATE_SERVING, "b", 2);
  v1::ReplicasResponse r = board_.Replicas("inf", Holders(4), kT0);
  ASSERT_EQ(r.replicas_size(), 2) << r.ShortDebugString();  // no unlabelled replica
  EXPECT_EQ(Find(r, "a")->state(), v1::REPLICA_SERVING);
  EXPECT_EQ(Find(r, "a")->version(), 5);
  EXPECT_EQ(Find(r, "b")->state(), v1::REPLICA_MIXED);
  EXPECT_EQ(Find(r, "b")->ranks(1).rank(), 3);
}

TEST_F(ServingBoardTest, ReplicaWithFewerRanksThanItsSizeIsIncomplete) {
  Set(0, 4, 5, v1::SERVING_STATE_SERVING, "a", 2);
  Set(1, 4, 5, v1::SERVING_STATE_SERVING, "a", 2);
  Set(2, 4, 5, v1::SERVING_STATE_SERVING, "b", 2);  // rank 3 never said
  v1::ReplicasResponse r = board_.Replicas("inf", Holders(4), kT0);
  EXPECT_EQ(Find(r, "a")->state(), v1::REPLICA_SERVING);
  EXPECT_EQ(Find(r, "b")->state(), v1::REPLICA_INCOMPLETE);
  EXPECT_EQ(Find(r, "b")->expected_ranks(), 2);
  // The silent live rank 3 sits in the unlabelled replica.
  const v1::ReplicaServing* rest = Find(r, "");
  ASSERT_NE(rest, nullptr);
  EXPECT_EQ(rest->state(), v1::REPLICA_INCOMPLETE);
  ASSERT_EQ(rest->ranks_size(), 1);
  EXPECT_EQ(rest->ranks(0).rank(), 3);
}

TEST_F(ServingBoardTest, LostLeaseMakesItsReplicaIncompleteUntilTheNewHolderReports) {
  Set(0, 2, 9, v1::SERVING_STATE_SERVING, "a", 2);
  Set(1, 2, 9, v1::SERVING_STATE_SERVING, "a", 2);
  GroupHolders h = Holders(2);
  h.leases[1] = "";  // rank 1's lease expired
  v1::ReplicasResponse r = board_.Replicas("inf", h, kT0);
  ASSERT_EQ(r.replicas_size(), 1);
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_INCOMPLETE);
  EXPECT_FALSE(r.replicas(0).ranks(1).live());
  EXPECT_EQ(r.replicas(0).ranks(1).version(), 9);

  // A restarted worker holds rank 1 under a new lease: silent until it reports.
  h.leases[1] = "L1b";
  r = board_.Replicas("inf", h, kT0);
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_INCOMPLETE);
  EXPECT_TRUE(r.replicas(0).ranks(1).live());
  EXPECT_FALSE(r.replicas(0).ranks(1).reported());
  ASSERT_TRUE(board_
                  .Record("L1b", Member("inf", 1, 2),
                          Report("inf", 9, v1::SERVING_STATE_SERVING, "a", 2), kT0)
                  .ok());
  r = board_.Replicas("inf", h, kT0);
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_SERVING);
  EXPECT_EQ(r.replicas(0).version(), 9);
}

TEST_F(ServingBoardTest, ReportsOfLostLeasesAreForgottenLater) {
  Set(0, 2, 3, v1::SERVING_STATE_SERVING, "a", 2);
  Set(1, 2, 3, v1::SERVING_STATE_SERVING, "a", 2);
  GroupHolders none;  // every worker gone
  v1::ReplicasResponse r = board_.Replicas("inf", none, kT0 + absl::Minutes(1));
  ASSERT_EQ(r.replicas_size(), 1);
  EXPECT_EQ(r.group_size(), -1);
  EXPECT_EQ(r.replicas(0).state(), v1::REPLICA_INCOMPLETE);
  r = board_.Replicas("inf", none, kT0 + absl::Minutes(11));
  EXPECT_EQ(r.replicas_size(), 0);
  EXPECT_TRUE(board_.Groups().empty());
}

TEST_F(ServingBoardTest, BadReportsAreRefusedWhole) {
  auto reports = Report("inf", 1, v1::SERVING_STATE_SERVING);
  *reports.Add() = Report("other", 1, v1::SERVING_STATE_SERVING)[0];
  absl::Status s = board_.Record("L0", Member("inf", 0, 1), reports, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'other'"));
  EXPECT_TRUE(board_.Groups().empty());  // the valid one was not kept either

  s = board_.Record("L0", Member("inf", 0, 1), Report("inf", 1, v1::SERVING_STATE_UNSPECIFIED),
                    kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no state"));

  auto twice = Report("inf", 1, v1::SERVING_STATE_SERVING);
  *twice.Add() = twice[0];
  s = board_.Record("L0", Member("inf", 0, 1), twice, kT0);
  EXPECT_THAT(s.message(), HasSubstr("repeated"));
}

// The value of wsync_replica_serving_version{group="inf",replica=`label`},
// or -1 when there is no such series.
double ReplicaVersionGauge(ControllerMetrics& m, const std::string& label) {
  for (const prometheus::MetricFamily& f : m.registry().Collect()) {
    if (f.name != "wsync_replica_serving_version") continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      bool match = true;
      for (const prometheus::ClientMetric::Label& l : c.label) {
        if (l.name == "replica") match &= l.value == label;
        if (l.name == "group") match &= l.value == "inf";
      }
      if (match) return c.gauge.value;
    }
  }
  return -1;
}

TEST(ServingBoardMetricsTest, GaugesFollowTheReplicasAndGoWithThem) {
  ControllerMetrics metrics;
  ServingBoard board(&metrics, absl::Minutes(10));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(board
                    .Record("L" + std::to_string(r), Member("inf", r, 2),
                            Report("inf", 8, v1::SERVING_STATE_SERVING, "a", 2), kT0)
                    .ok());
  }
  board.Export(board.Replicas("inf", Holders(2), kT0));
  EXPECT_EQ(ReplicaVersionGauge(metrics, "a"), 8);
  board.Export(board.Replicas("inf", GroupHolders{}, kT0));  // both workers lost
  EXPECT_EQ(ReplicaVersionGauge(metrics, "a"), 0);
  EXPECT_EQ(board.Groups(), std::vector<std::string>{"inf"});
  board.Export(board.Replicas("inf", GroupHolders{}, kT0 + absl::Minutes(11)));  // forgotten
  EXPECT_EQ(ReplicaVersionGauge(metrics, "a"), -1);
  EXPECT_TRUE(board.Groups().empty());
}

}  // namespace
}  // namespace wsync::controller
