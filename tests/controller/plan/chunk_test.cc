#include "controller/plan/compiled_layout.h"
#include "gtest/gtest.h"

namespace wsync::plan {
namespace {

TEST(ChunkIntervalTest, MatchesTorchChunk) {
  // torch.chunk(arange(5), 4) -> sizes 2, 2, 1 and an empty 4th shard.
  EXPECT_EQ(ChunkInterval(5, 4, 0).end - ChunkInterval(5, 4, 0).begin, 2);
  EXPECT_EQ(ChunkInterval(5, 4, 2).begin, 4);
  EXPECT_EQ(ChunkInterval(5, 4, 2).end, 5);
  EXPECT_EQ(ChunkInterval(5, 4, 3).begin, ChunkInterval(5, 4, 3).end);
}

}  // namespace
}  // namespace wsync::plan
