#include "common/box.h"

#include "gtest/gtest.h"

namespace wsync {
namespace {

TEST(BoxTest, IntersectOverlapping) {
  BoxNd a{{0, 4}, {8, 8}};
  BoxNd b{{6, 0}, {4, 6}};
  auto c = Intersect(a, b);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, (BoxNd{{6, 4}, {2, 2}}));
  EXPECT_EQ(c->NumElements(), 4);
}

TEST(BoxTest, IntersectTouchingIsEmpty) {
  EXPECT_FALSE(Intersect(BoxNd{{0}, {4}}, BoxNd{{4}, {4}}).has_value());
  EXPECT_FALSE(Intersect(BoxNd{{0}, {0}}, BoxNd{{0}, {4}}).has_value());
}

TEST(BoxTest, ContainsAndStrides) {
  EXPECT_TRUE((BoxNd{{0, 0}, {4, 4}}).Contains(BoxNd{{1, 1}, {3, 3}}));
  EXPECT_FALSE((BoxNd{{0, 0}, {4, 4}}).Contains(BoxNd{{1, 1}, {4, 3}}));
  EXPECT_EQ(RowMajorStrides({2, 3, 4}), (DimVector{12, 4, 1}));
  EXPECT_EQ((BoxNd{{0, 2}, {3, 4}}).ToString(), "[0:3, 2:6]");
}

}  // namespace
}  // namespace wsync
