// wsync-demo's worker placement: slots, nodes, the spec's nodes and link rates.
#include "tools/demo/placement.h"

#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace wsync::demo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PlacementTest, DefaultIsOneSlotPerWorkerOnNoNamedNode) {
  auto p = ParsePlacement("", 0, 3, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->slots, ElementsAre(0, 1, 2));
  EXPECT_THAT(p->nodes, ElementsAre("", "", ""));
}

TEST(PlacementTest, SlotsPerNodeNameTheNodes) {
  auto p = ParsePlacement("0,2,1,3", 2, 4, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->slots, ElementsAre(0, 2, 1, 3));
  EXPECT_THAT(p->nodes, ElementsAre("n0", "n1", "n0", "n1"));
}

TEST(PlacementTest, BadPlacementsNameTheFlag) {
  EXPECT_THAT(ParsePlacement("0,1", 0, 3, 0).status().message(), HasSubstr("2 slots for 3"));
  EXPECT_THAT(ParsePlacement("0,0", 0, 2, 0).status().message(), HasSubstr("given twice"));
  EXPECT_THAT(ParsePlacement("0,x", 0, 2, 0).status().message(), HasSubstr("'x'"));
  EXPECT_THAT(ParsePlacement("0,-1", 0, 2, 0).status().message(), HasSubstr("--placement"));
  EXPECT_THAT(ParsePlacement("0,4", 0, 2, 4).status().message(), HasSubstr("--gpus 4"));
  EXPECT_THAT(ParsePlacement("", -1, 2, 0).status().message(), HasSubstr("--slots_per_node"));
}

v1::TransferSpec TwoSides() {
  v1::TransferSpec spec;
  for (int w : {0, 1}) spec.mutable_source()->add_ranks()->set_worker(w);
  for (int w : {2, 3}) spec.mutable_destination()->add_ranks()->set_worker(w);
  for (auto* side : {spec.mutable_source(), spec.mutable_destination()}) {
    for (auto& r : *side->mutable_ranks()) r.set_node("node0");
  }
  return spec;
}

TEST(PlacementTest, ApplyNodesRenamesEveryRankOrNone) {
  v1::TransferSpec spec = TwoSides();
  auto none = ParsePlacement("", 0, 4, 0);
  ASSERT_TRUE(ApplyNodes(*none, &spec).ok());
  EXPECT_EQ(spec.destination().ranks(1).node(), "node0");
  auto split = ParsePlacement("0,2,1,3", 2, 4, 0);
  ASSERT_TRUE(ApplyNodes(*split, &spec).ok());
  EXPECT_EQ(spec.source().ranks(0).node(), "n0");
  EXPECT_EQ(spec.source().ranks(1).node(), "n1");
  EXPECT_EQ(spec.destination().ranks(0).node(), "n0");
  EXPECT_EQ(spec.destination().ranks(1).node(), "n1");
  auto short_placement = ParsePlacement("", 1, 3, 0);
  EXPECT_THAT(ApplyNodes(*short_placement, &spec).message(), HasSubstr("worker 3"));
}

TEST(PlacementTest, LinkRatesInGbPerSecondAndZeroKeepsTheField) {
  v1::TransferSpec spec;
  spec.mutable_options()->mutable_link_model()->set_local_copy_bytes_per_second(7);
  ASSERT_TRUE(ApplyLinkRates(300, 4.5, 0, &spec).ok());
  const v1::LinkModel& lm = spec.options().link_model();
  EXPECT_DOUBLE_EQ(lm.nvlink_bytes_per_second(), 300e9);
  EXPECT_DOUBLE_EQ(lm.nic_bytes_per_second(), 4.5e9);
  EXPECT_DOUBLE_EQ(lm.local_copy_bytes_per_second(), 7);
  EXPECT_FALSE(ApplyLinkRates(-1, 1, 1, &spec).ok());
}

TEST(PlacementTest, SpecJsonReadsBack) {
  v1::TransferSpec spec = TwoSides();
  const std::string path = ::testing::TempDir() + "/placement_spec.json";
  ASSERT_TRUE(WriteSpecJson(spec, path).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  v1::TransferSpec back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &back).ok());
  EXPECT_EQ(back.SerializeAsString(), spec.SerializeAsString());
  EXPECT_FALSE(WriteSpecJson(spec, "/nonexistent-dir/x.json").ok());
}

}  // namespace
}  // namespace wsync::demo
