// Durable versions (sync_coordinator.h, state_store.h): a controller
// restarted from its saved state serves the same transfers, refuses older
// versions (the same one only with resend) and still answers for its syncs.
#include <stdlib.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

class SyncDurabilityTest : public controller_testing::CoordinatorFixture {
 protected:
  SyncDurabilityTest() {
    std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-durable-XXXXXX");
    EXPECT_NE(mkdtemp(dir.data()), nullptr);
    store_ = std::make_unique<StateStore>(dir + "/controller.state");
    Restart();
  }

  // Registers src/0, src/1, dst/0 with open streams (again after a restart).
  void RegisterAll() {
    leases_ = {Register("a", "src", 0, 2, 16), Register("b", "src", 1, 2, 16),
               Register("c", "dst", 0, 1, 32)};
    for (const auto& l : leases_) tokens_[l] = *controller_->workers().OpenStream(l);
  }

  absl::StatusOr<v1::SyncResponse> Sync(int64_t version, bool resend = false,
                                        const TrainerCaller& caller = {}) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(version);
    req.set_resend(resend);
    return controller_->syncs().StartSync(req, caller);
  }

  // Runs version `v` to success; returns its sync id.
  std::string Deliver(int64_t v, bool resend = false) {
    auto started = Sync(v, resend);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return "";
    for (const auto& l : leases_) ReportOk(l, Next(l, tokens_[l]));
    auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
    EXPECT_TRUE(st.ok() && st->phase() == v1::SYNC_SUCCEEDED);
    return started->sync_id();
  }

  std::vector<std::string> leases_;
  std::map<std::string, uint64_t> tokens_;
};

TEST_F(SyncDurabilityTest, ARestartedControllerServesTheSameTransferAndNeverGoesBack) {
  RegisterAll();
  DefineSimple();
  Deliver(1);
  const std::string v5 = Deliver(5);
  auto cut = Sync(6);  // running when the controller stops
  ASSERT_TRUE(cut.ok()) << cut.status();

  Restart();  // same state file, no DefineTransfer
  RegisterAll();
  const v1::GetStatusResponse status = controller_->syncs().GetStatus();
  ASSERT_EQ(status.transfers_size(), 1);
  EXPECT_EQ(status.transfers(0).name(), "t");
  EXPECT_EQ(status.transfers(0).last_success_version(), 5);

  auto old = Sync(1);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("last delivered version 5"), std::string::npos)
      << old.status();
  auto same = Sync(5);
  EXPECT_EQ(same.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(same.status().message().find("resend"), std::string::npos) << same.status();
  Deliver(5, /*resend=*/true);
  EXPECT_EQ(Sync(4, /*resend=*/true).status().code(), absl::StatusCode::kFailedPrecondition)
      << "resend allows the same version, never an older one";

  // The saved outcome answers; the cut sync's id says what happened.
  auto finished = controller_->syncs().WaitSync(v5, absl::Milliseconds(1));
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->phase(), v1::SYNC_SUCCEEDED);
  auto unknown = controller_->syncs().WaitSync(cut->sync_id(), absl::Milliseconds(1));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("earlier controller instance"), std::string::npos)
      << unknown.status();
  // A writer of a sync the earlier instance ran waits for no one.
  v1::AwaitWritersRequest await;
  await.set_sync_id(v5);
  await.add_workers(0);
  await.set_timeout_ms(1000);
  auto writers = controller_->syncs().AwaitWriters(await);
  ASSERT_TRUE(writers.ok()) << writers.status();
  EXPECT_EQ(writers->pending_size(), 0);
  // New ids never collide with the earlier instance's.
  const std::string v6 = Deliver(6);
  EXPECT_NE(v6, cut->sync_id());
}

TEST_F(SyncDurabilityTest, EveryDefinitionAndFinishedSyncIsSavedBeforeItIsSeen) {
  RegisterAll();
  DefineSimple();
  EXPECT_EQ(store_->saves(), 1);
  auto started = Sync(1);
  ASSERT_TRUE(started.ok());
  for (const auto& l : leases_) ReportOk(l, Next(l, tokens_[l]));
  auto saved = store_->Load();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->transfers_size(), 1);
  EXPECT_EQ(saved->transfers(0).last_success_version(), 1);
  ASSERT_EQ(saved->recent_syncs_size(), 1);
  EXPECT_EQ(saved->recent_syncs(0).sync_id(), started->sync_id());
}

// docs/security.md, "Transfer owners": the identity that defined a transfer
// owns it across a restart; another trainer may not sync, redefine or cancel
// it (failed before owners: any trainer could), an admin may.
TEST_F(SyncDurabilityTest, ATransferBelongsToTheIdentityThatDefinedItAcrossARestart) {
  const TrainerCaller alice{"token:alice", false}, carol{"token:carol", false};
  const TrainerCaller ops{"token:ops", true};
  RegisterAll();
  ASSERT_TRUE(
      controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer(), alice).ok());
  Deliver(1);
  Restart();
  RegisterAll();
  const v1::GetStatusResponse status = controller_->syncs().GetStatus();
  ASSERT_EQ(status.transfers_size(), 1);
  EXPECT_EQ(status.transfers(0).owner(), "token:alice");

  for (const absl::Status& refused :
       {Sync(2, false, carol).status(),
        controller_->syncs()
            .DefineTransfer(controller_testing::SimpleTransfer(), carol)
            .status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("'token:alice'"));
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("'token:carol'"));
  }
  // An admin may sync it; the owner, not another trainer, may cancel that.
  auto by_admin = Sync(2, false, ops);
  ASSERT_TRUE(by_admin.ok()) << by_admin.status();
  auto carol_cancel = controller_->syncs().Cancel(by_admin->sync_id(), "", carol);
  EXPECT_EQ(carol_cancel.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(carol_cancel.status().message(), ::testing::HasSubstr("token:alice"));
  auto alice_cancel = controller_->syncs().Cancel(by_admin->sync_id(), "", alice);
  ASSERT_TRUE(alice_cancel.ok()) << alice_cancel.status();
  EXPECT_EQ(alice_cancel->phase(), v1::SYNC_CANCELLED);
  auto redefined = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer(), ops);
  ASSERT_TRUE(redefined.ok()) << redefined.status();
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).owner(), "token:alice")
      << "an admin's redefinition keeps the owner";
}

// A state saved before owners existed (no owner field) still loads; its
// transfers are claimed by the first trainer identity that uses them.
TEST_F(SyncDurabilityTest, AnUnownedTransferIsClaimedByItsFirstTrainer) {
  RegisterAll();
  DefineSimple();  // anonymous: saved without an owner
  Deliver(1);
  Restart();
  RegisterAll();
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).owner(), "");
  const TrainerCaller alice{"token:alice", false}, carol{"token:carol", false};
  auto first = Sync(2, false, carol);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(controller_->syncs().GetStatus().transfers(0).owner(), "token:carol");
  EXPECT_EQ(controller_->syncs().Cancel(first->sync_id(), "", alice).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace wsync::controller
