// PartCache: bounded by bytes, least recently used evicted first, evictions
// kept for the next report, the newest part always kept.
#include "worker/agent/part_cache.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A part whose serialized size is about `bytes`.
std::shared_ptr<const v1::Plan> PartOf(int bytes) {
  auto p = std::make_shared<v1::Plan>();
  p->set_key(std::string(static_cast<size_t>(bytes), 'k'));
  return p;
}

TEST(PartCacheTest, EvictsTheLeastRecentlyUsedBeyondTheBudget) {
  const int64_t one = static_cast<int64_t>(PartOf(100)->ByteSizeLong());
  PartCache cache(3 * one);
  EXPECT_THAT(cache.Put("a", PartOf(100)), IsEmpty());
  EXPECT_THAT(cache.Put("b", PartOf(100)), IsEmpty());
  EXPECT_THAT(cache.Put("c", PartOf(100)), IsEmpty());
  EXPECT_EQ(cache.bytes(), 3 * one);
  ASSERT_NE(cache.Get("a"), nullptr);  // "b" is now the least recently used
  EXPECT_THAT(cache.Put("d", PartOf(100)), ElementsAre("b"));
  EXPECT_EQ(cache.Get("b"), nullptr);
  EXPECT_NE(cache.Get("a"), nullptr);
  EXPECT_THAT(cache.TakeEvicted(), ElementsAre("b"));
  EXPECT_THAT(cache.TakeEvicted(), IsEmpty()) << "taken once";
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_LE(cache.bytes(), cache.budget_bytes());
}

TEST(PartCacheTest, TheNewestStaysAloneAboveTheBudget) {
  PartCache cache(1);
  EXPECT_THAT(cache.Put("a", PartOf(50)), IsEmpty());
  EXPECT_THAT(cache.Put("b", PartOf(50)), ElementsAre("a"));
  EXPECT_NE(cache.Get("b"), nullptr);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_THAT(cache.TakeEvicted(), ElementsAre("a"));
}

TEST(PartCacheTest, ReplacingAKeyCountsItsBytesOnce) {
  PartCache cache(1 << 20);
  cache.Put("a", PartOf(1000));
  const int64_t before = cache.bytes();
  cache.Put("a", PartOf(10));
  EXPECT_LT(cache.bytes(), before);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Get("a")->key().size(), 10u);
  EXPECT_THAT(cache.TakeEvicted(), IsEmpty());
}

}  // namespace
}  // namespace wsync::agent
