// StreamCancel (worker/agent/stream_cancel.h): a cancel of the lane's
// assignment stream is never lost, whether it comes before the reader of
// its lease epoch starts or while it reads; it never ends a later epoch's.
#include "worker/agent/stream_cancel.h"

#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

TEST(StreamCancelTest, ACancelBeforeTheReaderStartsIsKept) {
  StreamCancel cancel;
  EXPECT_FALSE(cancel.Cancelled(1));
  // The heartbeat hears NOT_FOUND for epoch 1 while the session is still
  // connecting the lane: the reader of epoch 1 starts after it.
  cancel.Cancel(1);
  EXPECT_TRUE(cancel.Cancelled(1)) << "lost to a reader that started late";
  EXPECT_FALSE(cancel.Cancelled(2)) << "the next registration's stream is not cancelled";
  cancel.Cancel(1);  // a late repeat changes nothing for epoch 2
  EXPECT_FALSE(cancel.Cancelled(2));
  cancel.Cancel(3);
  EXPECT_TRUE(cancel.Cancelled(2));
  EXPECT_TRUE(cancel.Cancelled(3));
  cancel.Cancel(2);  // never moves back
  EXPECT_TRUE(cancel.Cancelled(3));
  cancel.CancelAll();
  EXPECT_TRUE(cancel.Cancelled(1000));
}

}  // namespace
}  // namespace wsync::agent
