// The landing-part rule of transport.h (RoundHooks): both sides of a pair
// must cut a list alike, so the rule is a pure function of the list's bytes.
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "worker/plane/transport.h"

namespace wsync::transport {
namespace {

TEST(LandingPartsTest, CountIsBoundedByMaxPartsAndMinPartBytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(LandingPartCount(16000 * kMiB, 16, 64 * kMiB), 16);
  EXPECT_EQ(LandingPartCount(200 * kMiB, 16, 64 * kMiB), 3);
  EXPECT_EQ(LandingPartCount(63 * kMiB, 16, 64 * kMiB), 1);
  EXPECT_EQ(LandingPartCount(16000 * kMiB, 1, 64 * kMiB), 1);
  EXPECT_EQ(LandingPartCount(0, 16, 64 * kMiB), 1);
  EXPECT_EQ(LandingPartCount(std::numeric_limits<int64_t>::max(), 16, 0), 16);
}

TEST(LandingPartsTest, PartsFollowTheRunningByteCountAndStayInRange) {
  EXPECT_EQ(LandingPartOf(0, 1000, 4), 0);
  EXPECT_EQ(LandingPartOf(249, 1000, 4), 0);
  EXPECT_EQ(LandingPartOf(250, 1000, 4), 1);
  EXPECT_EQ(LandingPartOf(999, 1000, 4), 3);
  EXPECT_EQ(LandingPartOf(5000, 1000, 4), 3);  // past the end: the last part
  EXPECT_EQ(LandingPartOf(500, 1000, 1), 0);
  // No overflow near 2^63.
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(LandingPartOf(big - 1, big, 16), 15);
  EXPECT_EQ(LandingPartOf(big / 2, big, 16), 7);
}

TEST(LandingPartsTest, PartsNeverDecreaseAlongAList) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 300; ++i) sizes.push_back(1 + (i * 7919) % 100000);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  const int32_t parts = LandingPartCount(total, 16, 1 << 20);
  int32_t last = 0;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    const int32_t p = LandingPartOf(offset, total, parts);
    EXPECT_GE(p, last);
    EXPECT_LT(p, parts);
    last = p;
    offset += s;
  }
  EXPECT_EQ(last, parts - 1);
}

}  // namespace
}  // namespace wsync::transport
