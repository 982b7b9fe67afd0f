// The coordinator's warm-ups (docs/warm-up.md): dispatched on define and when
// the workers change, waited for by a sync, never failing one, aborted by a
// redefinition, a cancel, a lost worker or their deadline.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class SyncWarmUpTest : public controller_testing::CoordinatorFixture {
 protected:
  SyncWarmUpTest() {
    config_.warm_up_on_define = true;
    Restart();
  }

  // Three workers over the Gloo transport (2 sources, 1 destination), their
  // streams open.
  void RegisterThree(int64_t dst_bytes = 32) {
    leases_list_ = {Register("a", "src", 0, 2, 16, {v1::TRANSPORT_GLOO}),
                    Register("b", "src", 1, 2, 16, {v1::TRANSPORT_GLOO}),
                    Register("c", "dst", 0, 1, dst_bytes, {v1::TRANSPORT_GLOO})};
    for (const std::string& l : leases_list_) OpenStream(l);
  }
  void OpenStream(const std::string& lease) {
    auto token = controller_->workers().OpenStream(lease);
    ASSERT_TRUE(token.ok()) << token.status();
    tokens_[lease] = *token;
  }

  // The next assignment on `lease`'s stream, if one is queued.
  std::optional<v1::Assignment> Poll(const std::string& lease) {
    auto a = controller_->workers().NextAssignment(lease, tokens_[lease], absl::ZeroDuration());
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : std::nullopt;
  }
  // Takes one warm-up assignment from every worker.
  std::vector<v1::SyncAssignment> TakeWarmUps() {
    std::vector<v1::SyncAssignment> out;
    for (const std::string& l : leases_list_) {
      v1::SyncAssignment a = Next(l, tokens_[l]);
      EXPECT_TRUE(a.warm_up()) << a.sync_id();
      EXPECT_EQ(a.version(), 0);
      out.push_back(a);
    }
    return out;
  }
  void ReportWarm(const std::vector<v1::SyncAssignment>& warm) {
    for (size_t i = 0; i < warm.size(); ++i) {
      v1::ReportResultRequest r;
      r.set_lease_id(leases_list_[i]);
      r.set_sync_id(warm[i].sync_id());
      r.set_warm_up(true);
      ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
    }
  }
  v1::TransferStatus Status() {
    v1::GetStatusResponse s = controller_->syncs().GetStatus();
    EXPECT_EQ(s.transfers_size(), 1);
    return s.transfers_size() > 0 ? s.transfers(0) : v1::TransferStatus();
  }
  // Runs a sync of `version` whose assignments are already queued to the end.
  v1::SyncStatus RunQueuedSync(const std::string& id, bool expect_plan) {
    for (const std::string& l : leases_list_) {
      v1::SyncAssignment a = Next(l, tokens_[l]);
      EXPECT_FALSE(a.warm_up());
      EXPECT_EQ(a.sync_id(), id);
      EXPECT_EQ(a.has_plan(), expect_plan);
      ReportOk(l, a);
    }
    auto st = controller_->syncs().WaitSync(id, absl::Seconds(1));
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::SyncStatus();
  }

  std::vector<std::string> leases_list_;
  std::map<std::string, uint64_t> tokens_;
};

TEST_F(SyncWarmUpTest, DefineWarmsEveryWorkerAndTheFirstSyncReusesItsGeneration) {
  RegisterThree();
  auto defined = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer());
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_THAT(defined->warm_up_id(), StartsWith("t@warm#"));
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_RUNNING);
  std::vector<v1::SyncAssignment> warm = TakeWarmUps();
  const int64_t generation = warm[0].transport().generation();
  for (const v1::SyncAssignment& a : warm) {
    EXPECT_EQ(a.sync_id(), defined->warm_up_id());
    EXPECT_TRUE(a.has_plan()) << "the op list goes with the warm-up";
    EXPECT_EQ(a.transport().kind(), v1::TRANSPORT_GLOO);
    EXPECT_EQ(a.transport().generation(), generation);
  }
  ReportWarm(warm);
  v1::TransferStatus ts = Status();
  EXPECT_EQ(ts.warm_up().state(), v1::WARM_UP_WARM);
  EXPECT_EQ(ts.warm_up().generation(), generation);
  EXPECT_EQ(ts.warm_up().workers_done(), 3);
  // Nothing delivered, nothing recorded as a sync.
  EXPECT_EQ(ts.last_success_version(), 0);
  EXPECT_FALSE(ts.has_last_sync());
  // Nothing changed: later ticks start no other warm-up.
  controller_->Tick();
  for (const std::string& l : leases_list_) EXPECT_FALSE(Poll(l).has_value());

  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  for (const std::string& l : leases_list_) {
    v1::SyncAssignment a = Next(l, tokens_[l]);
    EXPECT_FALSE(a.has_plan()) << "sent with the warm-up";
    EXPECT_EQ(a.transport().generation(), generation) << "the warmed transport is reused";
    ReportOk(l, a);
  }
  auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  EXPECT_THAT(st->warm_up(), HasSubstr("warm (warm-up t@warm#"));
}

TEST_F(SyncWarmUpTest, ASyncStartedDuringTheWarmUpWaitsForIt) {
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> warm = TakeWarmUps();
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  auto running = controller_->syncs().WaitSync(started->sync_id(), absl::Milliseconds(1));
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->phase(), v1::SYNC_RUNNING);
  EXPECT_THAT(running->warm_up(), HasSubstr("waiting for warm-up"));
  // Held: no worker has it before its warm-up ended.
  for (const std::string& l : leases_list_) EXPECT_FALSE(Poll(l).has_value());
  ReportWarm(warm);
  v1::SyncStatus st = RunQueuedSync(started->sync_id(), /*expect_plan=*/false);
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_THAT(st.warm_up(), HasSubstr("warm (warm-up"));
  EXPECT_THAT(st.warm_up(), HasSubstr("waited"));
  EXPECT_EQ(Status().last_success_version(), 1);
}

TEST_F(SyncWarmUpTest, AFailedWarmUpFailsNoSyncAndTheSyncSetsUpAFreshGeneration) {
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> warm = TakeWarmUps();
  const int64_t generation = warm[0].transport().generation();
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  ReportFailed(leases_list_[2], warm[2].sync_id(), absl::StatusCode::kUnavailable,
               "gloo connect refused");
  v1::TransferStatus ts = Status();
  EXPECT_EQ(ts.warm_up().state(), v1::WARM_UP_FAILED);
  EXPECT_THAT(ts.warm_up().reason(), HasSubstr("gloo connect refused"));
  EXPECT_THAT(ts.warm_up().reason(), HasSubstr("[worker 2]"));
  // The others are told to stop preparing; then the held sync goes out.
  for (int i = 0; i < 2; ++i) {
    std::optional<v1::Assignment> abort = Poll(leases_list_[i]);
    ASSERT_TRUE(abort.has_value() && abort->has_abort());
    EXPECT_EQ(abort->abort().sync_id(), warm[i].sync_id());
  }
  for (const std::string& l : leases_list_) {
    v1::SyncAssignment a = Next(l, tokens_[l]);
    EXPECT_EQ(a.sync_id(), started->sync_id());
    EXPECT_GT(a.transport().generation(), generation) << "a fresh rendezvous";
    ReportOk(l, a);
  }
  auto st = controller_->syncs().WaitSync(started->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  EXPECT_THAT(st->warm_up(), HasSubstr("cold: warm-up"));
  EXPECT_THAT(st->warm_up(), HasSubstr("gloo connect refused"));
  // A late report of the failed warm-up changes nothing.
  ReportWarm(warm);
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_FAILED);
}

TEST_F(SyncWarmUpTest, ARedefinitionAbortsTheRunningWarmUpAndStartsAnother) {
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> first = TakeWarmUps();
  auto again = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_NE(again->warm_up_id(), first[0].sync_id());
  for (size_t i = 0; i < leases_list_.size(); ++i) {
    std::optional<v1::Assignment> abort = Poll(leases_list_[i]);
    ASSERT_TRUE(abort.has_value() && abort->has_abort());
    EXPECT_EQ(abort->abort().sync_id(), first[i].sync_id());
    EXPECT_THAT(abort->abort().reason(), HasSubstr("redefined"));
  }
  std::vector<v1::SyncAssignment> second = TakeWarmUps();
  EXPECT_EQ(second[0].sync_id(), again->warm_up_id());
  EXPECT_GT(second[0].transport().generation(), first[0].transport().generation());
  ReportWarm(first);  // the aborted one's late reports: ignored
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_RUNNING);
  ReportWarm(second);
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_WARM);
  EXPECT_EQ(Status().warm_up().id(), again->warm_up_id());
}

TEST_F(SyncWarmUpTest, AWorkerThatRegistersAgainIsWarmedUpWithANewGeneration) {
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> first = TakeWarmUps();
  ReportWarm(first);
  leases_list_[2] = Register("c", "dst", 0, 1, 32, {v1::TRANSPORT_GLOO});  // replaces its lease
  OpenStream(leases_list_[2]);
  controller_->Tick();
  std::vector<v1::SyncAssignment> second = TakeWarmUps();
  EXPECT_NE(second[0].sync_id(), first[0].sync_id());
  EXPECT_GT(second[0].transport().generation(), first[0].transport().generation());
  EXPECT_TRUE(second[2].has_plan()) << "the new lease has no op list yet";
  EXPECT_FALSE(second[0].has_plan()) << "the others keep theirs";
  ReportWarm(second);
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_WARM);
}

TEST_F(SyncWarmUpTest, AWarmUpWaitsForMissingBuffersThenStarts) {
  RegisterThree();
  // The destination's owner has registered nothing yet.
  v1::UpdateBuffersRequest update;
  update.set_lease_id(leases_list_[2]);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  auto defined = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer());
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_EQ(defined->warm_up_id(), "");
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_PENDING);
  EXPECT_THAT(Status().warm_up().reason(), HasSubstr("no buffer 'w' registered in group 'dst'"));
  controller_->Tick();  // nothing changed: not retried
  for (const std::string& l : leases_list_) EXPECT_FALSE(Poll(l).has_value());
  auto* b = update.add_buffers();
  b->set_group("dst");
  b->set_name("w");
  b->set_dtype(v1::FP32);
  b->set_bytes(32);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  controller_->Tick();
  ReportWarm(TakeWarmUps());
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_WARM);
}

TEST_F(SyncWarmUpTest, ACancelEndsTheWarmUpAndNothingElse) {
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> warm = TakeWarmUps();
  auto cancelled = controller_->syncs().Cancel(warm[0].sync_id(), "not now");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->phase(), v1::SYNC_CANCELLED);
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_FAILED);
  EXPECT_THAT(Status().warm_up().reason(), HasSubstr("not now"));
  for (size_t i = 0; i < leases_list_.size(); ++i) {
    std::optional<v1::Assignment> abort = Poll(leases_list_[i]);
    ASSERT_TRUE(abort.has_value() && abort->has_abort());
    EXPECT_EQ(abort->abort().sync_id(), warm[i].sync_id());
  }
  controller_->Tick();  // nothing changed since: no new warm-up
  for (const std::string& l : leases_list_) EXPECT_FALSE(Poll(l).has_value());
  EXPECT_EQ(Status().last_success_version(), 0);
  EXPECT_FALSE(Status().has_last_sync());
}

TEST_F(SyncWarmUpTest, ALostWorkerFailsTheWarmUpNamingIt) {
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> warm = TakeWarmUps();
  controller_->workers().CloseStream(leases_list_[1], tokens_[leases_list_[1]], "test closed it");
  v1::TransferStatus ts = Status();
  EXPECT_EQ(ts.warm_up().state(), v1::WARM_UP_FAILED);
  EXPECT_THAT(ts.warm_up().reason(), HasSubstr("[worker 1] lost"));
  EXPECT_THAT(ts.warm_up().reason(), HasSubstr("test closed it"));
  controller_->Tick();  // a rank is missing now: pending
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_PENDING);
  EXPECT_THAT(Status().warm_up().reason(), HasSubstr("src"));
  EXPECT_EQ(Status().last_success_version(), 0);
}

TEST_F(SyncWarmUpTest, ASyncThatWaitedPastItsDeadlineFailsNamingTheWarmUp) {
  config_.warm_up_deadline = absl::Milliseconds(200);
  config_.failure_grace = absl::Milliseconds(50);
  Restart();
  RegisterThree();
  DefineSimple();
  std::vector<v1::SyncAssignment> warm = TakeWarmUps();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  req.set_deadline_ms(100);
  auto started = controller_->syncs().StartSync(req);
  ASSERT_TRUE(started.ok()) << started.status();
  v1::SyncStatus st = TickUntilEnded(started->sync_id(), leases_list_, absl::Seconds(5));
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st.error_code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(st.error(), HasSubstr(warm[0].sync_id()));
  // The warm-up itself ends at its own deadline, naming the silent workers.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (Status().warm_up().state() == v1::WARM_UP_RUNNING && absl::Now() < until) {
    for (const std::string& l : leases_list_) (void)controller_->workers().Heartbeat(l);
    controller_->Tick();
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_FAILED);
  EXPECT_THAT(Status().warm_up().reason(), HasSubstr("--warm_up_deadline"));
}

TEST_F(SyncWarmUpTest, ATransferDefinedWithNoWarmUpGetsNone) {
  RegisterThree();
  v1::DefineTransferRequest req = controller_testing::SimpleTransfer();
  req.set_no_warm_up(true);
  auto defined = controller_->syncs().DefineTransfer(req);
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_EQ(defined->warm_up_id(), "");
  controller_->Tick();
  for (const std::string& l : leases_list_) EXPECT_FALSE(Poll(l).has_value());
  EXPECT_EQ(Status().warm_up().state(), v1::WARM_UP_OFF);
  auto started = StartSync(1);
  ASSERT_TRUE(started.ok()) << started.status();
  v1::SyncStatus st = RunQueuedSync(started->sync_id(), /*expect_plan=*/true);
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_EQ(st.warm_up(), "");
}

}  // namespace
}  // namespace wsync::controller
