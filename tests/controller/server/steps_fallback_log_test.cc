#include "controller/server/steps_fallback_log.h"

#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

WorkerSnapshot Leased(const std::string& lease) {
  WorkerSnapshot w;
  w.lease_id = lease;
  w.description = "worker " + lease;
  return w;
}

// Once per (transfer, lease): the same older worker seen again (another plan
// request, a registry change elsewhere) is not warned about twice; a new
// lease (it restarted, still old) or another transfer is.
TEST(StepsFallbackLogTest, WarnsOncePerTransferAndLease) {
  StepsFallbackLog log;
  EXPECT_TRUE(log.Note("t", Leased("a"), 3));
  EXPECT_FALSE(log.Note("t", Leased("a"), 3));
  EXPECT_TRUE(log.Note("u", Leased("a"), 0));
  EXPECT_TRUE(log.Note("t", Leased("b"), 3));
  EXPECT_FALSE(log.Note("t", Leased("b"), 3));
  EXPECT_TRUE(log.Note("t", Leased("a"), 3)) << "the culprit changed back";
}

}  // namespace
}  // namespace wsync::controller
