// Peer buffer lists in the assignments of direct writers: sent once per
// registration of the peer, again after a failure, kept per transfer
// (routes_fixture.h).
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/routes_fixture.h"

namespace wsync::controller {
namespace {

using routes_testing::Host;
using routes_testing::ShmBuffer;
using routes_testing::WorkerSpec;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using PeerListsTest = routes_testing::SyncRoutesTest;

// A receiver's list is sent to each writer once per registration: later
// assignments mark it unchanged (a big model's list is thousands of entries),
// until the receiver registers again or the writer's sync fails.
TEST_F(PeerListsTest, PeerListsAreSentOncePerRegistrationAndAgainAfterAFailure) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  v1::UpdateBuffersRequest update;
  update.set_lease_id(leases[2]);
  for (int i = 0; i < 2000; ++i) {
    v1::BufferInfo b = ShmBuffer("dst", "/wsync-dst0", 32);  // "w", the plan's
    if (i > 0) b.set_name(absl::StrCat("layers.", i, ".weight"));
    *update.add_buffers() = b;
  }
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  auto peer_of = [](const v1::SyncAssignment& a) {
    EXPECT_EQ(a.peer_buffers_size(), 1);
    return a.peer_buffers_size() == 1 ? a.peer_buffers(0) : v1::PeerBuffers();
  };
  auto as = Sync(leases, 1);
  ASSERT_EQ(as.size(), 3u);
  const int64_t registration = peer_of(as[0]).registration();
  EXPECT_FALSE(peer_of(as[0]).unchanged());
  EXPECT_EQ(peer_of(as[0]).buffers_size(), 2000);
  const size_t full_bytes = as[0].ByteSizeLong();

  as = Sync(leases, 2);
  for (int w = 0; w < 2; ++w) {
    SCOPED_TRACE(w);
    EXPECT_TRUE(peer_of(as[w]).unchanged());
    EXPECT_EQ(peer_of(as[w]).buffers_size(), 0);
    EXPECT_EQ(peer_of(as[w]).registration(), registration);
    EXPECT_THAT(as[w].direct_write_to(), ElementsAre(2));
  }
  EXPECT_LT(as[0].ByteSizeLong() * 100, full_bytes)
      << as[0].ByteSizeLong() << " bytes against " << full_bytes;

  // The receiver registers again: the new list, under a new count.
  update.mutable_buffers()->DeleteSubrange(1000, 1000);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  as = Sync(leases, 3);
  EXPECT_FALSE(peer_of(as[0]).unchanged());
  EXPECT_EQ(peer_of(as[0]).buffers_size(), 1000);
  EXPECT_GT(peer_of(as[0]).registration(), registration);

  // Writer 0's sync fails: every writer of that sync gets its lists again
  // (the others may have dropped their mappings while unwinding).
  std::string id;
  Start(leases, 4, &id);
  ASSERT_FALSE(id.empty());
  for (int w = 0; w < 3; ++w) {
    v1::ReportResultRequest r;
    r.set_lease_id(leases[w]);
    r.set_sync_id(id);
    if (w == 0) {
      r.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
      r.set_message("peer mapping lost");
    }
    EXPECT_TRUE(controller_->syncs().ReportResult(r).ok());
  }
  for (int w = 1; w < 3; ++w) {  // the failure aborted the others' sync
    auto a = controller_->workers().NextAssignment(leases[w], tokens_[leases[w]],
                                                   absl::Milliseconds(100));
    ASSERT_TRUE(a.ok() && a->has_value() && (*a)->has_abort()) << "worker " << w;
  }
  as = Sync(leases, 5);
  EXPECT_FALSE(peer_of(as[0]).unchanged());
  EXPECT_EQ(peer_of(as[0]).buffers_size(), 1000);
  EXPECT_FALSE(peer_of(as[1]).unchanged());
  EXPECT_EQ(peer_of(as[1]).buffers_size(), 1000);
  as = Sync(leases, 6);
  EXPECT_TRUE(peer_of(as[0]).unchanged());
  EXPECT_TRUE(peer_of(as[1]).unchanged());
}

// Two transfers over the same workers: each keeps its own record of the lists
// it sent (as each worker keeps its mappings per transfer), so alternating
// syncs do not resend them.
TEST_F(PeerListsTest, PeerListsAreKeptPerTransfer) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  v1::DefineTransferRequest second = controller_testing::SimpleTransfer();
  second.set_name("t2");
  ASSERT_TRUE(controller_->syncs().DefineTransfer(second).ok());
  for (int v = 1; v <= 3; ++v) {
    for (const std::string transfer : {"t", "t2"}) {
      SCOPED_TRACE(absl::StrCat(transfer, " v", v));
      const auto as = Sync(leases, v, nullptr, transfer);
      ASSERT_EQ(as.size(), 3u);
      ASSERT_EQ(as[0].peer_buffers_size(), 1);
      EXPECT_EQ(as[0].peer_buffers(0).unchanged(), v > 1);
      EXPECT_EQ(as[0].peer_buffers(0).buffers_size(), v > 1 ? 0 : 1);
    }
  }
}

// A sync that fails clears the record of every participant at once, before
// their reports arrive: a retry started right away carries every list (the
// writers may drop their mappings while they unwind, or never see their
// queued assignment).
TEST_F(PeerListsTest, AFailedSyncResendsEveryListEvenBeforeTheWritersReport) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  Sync(leases, 1);
  std::string id;
  Start(leases, 2, &id);
  ASSERT_FALSE(id.empty());
  v1::ReportResultRequest r;
  r.set_lease_id(leases[2]);  // the receiver fails; the writers never report
  r.set_sync_id(id);
  r.set_code(static_cast<int32_t>(absl::StatusCode::kInternal));
  r.set_message("receiver failed");
  ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  for (int w = 0; w < 2; ++w) {
    auto a = controller_->workers().NextAssignment(leases[w], tokens_[leases[w]],
                                                   absl::Milliseconds(100));
    ASSERT_TRUE(a.ok() && a->has_value() && (*a)->has_abort()) << "worker " << w;
  }
  std::string retry;
  const auto as = Start(leases, 3, &retry);
  ASSERT_EQ(as.size(), 3u);
  for (int w = 0; w < 2; ++w) {
    SCOPED_TRACE(w);
    ASSERT_EQ(as[w].peer_buffers_size(), 1);
    EXPECT_FALSE(as[w].peer_buffers(0).unchanged());
    EXPECT_EQ(as[w].peer_buffers(0).buffers_size(), 1);
  }
}

// Registration counts are unique in the controller: a receiver that comes
// back under a new lease is never taken for the one its writers mapped.
TEST_F(PeerListsTest, ARegisteredAgainReceiverGetsANewCountAndItsWholeList) {
  auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  const int64_t first = Sync(leases, 1)[0].peer_buffers(0).registration();
  EXPECT_TRUE(Sync(leases, 2)[0].peer_buffers(0).unchanged());
  leases[2] = Register(Host("dst", 0, 1, 32, "host-a"));  // replaces the old lease
  const auto as = Sync(leases, 3);
  ASSERT_EQ(as[0].peer_buffers_size(), 1);
  EXPECT_NE(as[0].peer_buffers(0).registration(), first);
  EXPECT_FALSE(as[0].peer_buffers(0).unchanged());
  EXPECT_EQ(as[0].peer_buffers(0).buffers_size(), 1);
}

// Only kPeerListTransfers transfers keep their record (as the worker keeps
// only their mappings): an older one gets its lists again.
TEST_F(PeerListsTest, OnlyTheMostRecentTransfersKeepTheirLists) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  std::vector<std::string> names = {"t"};
  for (int i = 1; i <= kPeerListTransfers; ++i) {
    v1::DefineTransferRequest d = controller_testing::SimpleTransfer();
    d.set_name(absl::StrCat("t", i));
    ASSERT_TRUE(controller_->syncs().DefineTransfer(d).ok());
    names.push_back(d.name());
  }
  for (const std::string& n : names) {
    EXPECT_FALSE(Sync(leases, 1, nullptr, n)[0].peer_buffers(0).unchanged()) << n;
  }
  // "t" is the oldest of kPeerListTransfers + 1: forgotten; the latest kept.
  EXPECT_FALSE(Sync(leases, 2, nullptr, "t")[0].peer_buffers(0).unchanged());
  EXPECT_TRUE(Sync(leases, 2, nullptr, names.back())[0].peer_buffers(0).unchanged());
}

// A worker that does not say it understands `unchanged` gets whole lists.
TEST_F(PeerListsTest, WorkersWithoutTheCapabilityAlwaysGetWholeLists) {
  WorkerSpec old = Host("src", 0, 2, 16, "host-a");
  old.peer_lists_once = false;
  const std::vector<std::string> leases = {Register(old), Register(Host("src", 1, 2, 16, "host-a")),
                                           Register(Host("dst", 0, 1, 32, "host-a"))};
  Define();
  Sync(leases, 1);
  const auto as = Sync(leases, 2);
  EXPECT_FALSE(as[0].peer_buffers(0).unchanged());
  EXPECT_EQ(as[0].peer_buffers(0).buffers_size(), 1);
  EXPECT_TRUE(as[1].peer_buffers(0).unchanged());
}

}  // namespace
}  // namespace wsync::controller
