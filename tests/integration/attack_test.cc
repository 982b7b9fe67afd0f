// The attacks of issue 18 (item 1) against a plaintext (--insecure)
// controller, the weakest mode, where the lease secret alone must hold:
// forged results with guessed lease ids, an instance id replayed to take a
// rank, a rogue worker writing into a live rendezvous scope. Real processes
// on loopback; the attacker speaks the worker API directly.
#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;

class AttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartSyncedOnce(DefaultClusterOptions(), &run_));
  }

  v1::GetStatusResponse Status() {
    v1::GetStatusResponse resp;
    EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                  return run_->cluster->trainer().GetStatus(c, v1::GetStatusRequest(), &resp);
                }).ok());
    return resp;
  }

  v1::ListWorkersResponse Workers() {
    v1::ListWorkersResponse resp;
    EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                  return run_->cluster->trainer().ListWorkers(c, v1::ListWorkersRequest(), &resp);
                }).ok());
    return resp;
  }

  // Registers a worker of group `group` the way an attacker would.
  grpc::Status RegisterRogue(const std::string& instance, const v1::Membership& m,
                             v1::RegisterWorkerResponse* resp) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(instance);
    *req.add_memberships() = m;
    req.set_node("attacker");
    req.set_pid(1);
    return Call([&](grpc::ClientContext* c) {
      return run_->cluster->worker_api().RegisterWorker(c, req, resp);
    });
  }

  std::unique_ptr<CaseRun> run_;
};

// Today's code: lease ids were "L<controller instance>-<n>" and listed;
// forged successes for every guess made a sync SUCCEEDED with a destination
// worker frozen and its buffers still poisoned.
TEST_F(AttackTest, ForgedResultsWithGuessedLeaseIdsDoNotFinishASync) {
  const std::string instance = Status().controller_instance();
  ASSERT_FALSE(instance.empty());
  const v1::ListWorkersResponse listed = Workers();
  for (const v1::RegisteredWorker& w : listed.workers()) {
    EXPECT_EQ(w.lease_id(), "") << "ListWorkers lists no lease id";
  }
  run_->Fill(2);
  const pid_t victim = run_->cluster->worker(run_->dst_worker[1]).child.pid();
  ASSERT_TRUE(Freeze(victim)) << "pid " << victim;
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(2);
  v1::SyncResponse started;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run_->cluster->trainer().Sync(c, req, &started);
              }).ok());
  int accepted = 0;
  {
    // No lease at all (review finding: the participants a restarted
    // controller restores have no lease yet, and "" matched them).
    v1::ReportResultRequest blank;
    blank.set_sync_id(started.sync_id());
    blank.set_committed(true);
    v1::ReportResultResponse ignored;
    const grpc::Status s = Call([&](grpc::ClientContext* c) {
      return run_->cluster->worker_api().ReportResult(c, blank, &ignored);
    });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    accepted += s.ok();
  }
  for (int n = 1; n <= 64; ++n) {
    v1::ReportResultRequest forged;
    forged.set_lease_id(absl::StrCat("L", instance, "-", n));
    forged.set_sync_id(started.sync_id());
    v1::ReportResultResponse ignored;
    accepted += Call([&](grpc::ClientContext* c) {
                  return run_->cluster->worker_api().ReportResult(c, forged, &ignored);
                }).ok();
  }
  v1::WaitSyncRequest poll;
  poll.set_sync_id(started.sync_id());
  poll.set_timeout_ms(200);
  v1::SyncStatus during;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run_->cluster->trainer().WaitSync(c, poll, &during);
              }).ok());
  ASSERT_EQ(kill(victim, SIGCONT), 0);  // within the lease TTL
  EXPECT_EQ(accepted, 0);
  EXPECT_EQ(during.phase(), v1::SYNC_RUNNING) << "a frozen worker's sync cannot have ended";
  v1::SyncStatus st;
  ASSERT_TRUE(run_->Wait(started.sync_id(), &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run_->Verify(2, &first), 0) << first;
}

// Today's code: replaying a victim's listed instance_id took its rank (and
// with it the victim's assignments).
TEST_F(AttackTest, AReplayedInstanceIdDoesNotTakeTheRank) {
  const v1::ListWorkersResponse before = Workers();
  const v1::RegisteredWorker* victim = nullptr;
  for (const auto& w : before.workers()) {
    if (w.memberships(0).group() == "inference" && w.memberships(0).rank() == 0) victim = &w;
  }
  ASSERT_NE(victim, nullptr);
  v1::RegisterWorkerResponse resp;
  grpc::Status replay = RegisterRogue(victim->instance_id(), victim->memberships(0), &resp);
  EXPECT_EQ(replay.error_code(), grpc::StatusCode::ALREADY_EXISTS) << replay.error_message();
  EXPECT_THAT(replay.error_message(), HasSubstr("wsync-previous-lease"));
  const v1::ListWorkersResponse after = Workers();
  for (const auto& w : after.workers()) {
    if (w.instance_id() == victim->instance_id()) {
      EXPECT_TRUE(w.alive());
      EXPECT_EQ(w.pid(), victim->pid());
    }
  }
  run_->Fill(2);
  v1::SyncStatus st;
  ASSERT_TRUE(run_->SyncAndWait("t", 2, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
}

// Today's code: a worker registered in a made-up group could KvSet keys of
// a live transfer's rendezvous scope.
TEST_F(AttackTest, ARogueWorkerCannotWriteALiveRendezvousScope) {
  const v1::GetStatusResponse status = Status();
  ASSERT_EQ(status.transfers_size(), 1);
  const int64_t generation = status.transfers(0).generation();
  ASSERT_GT(generation, 0);
  v1::Membership m;
  m.set_group("made-up");
  m.set_rank(0);
  m.set_group_size(1);
  v1::RegisterWorkerResponse rogue;
  ASSERT_TRUE(RegisterRogue("rogue", m, &rogue).ok());
  for (const std::string key : {"rank0", "rank1", "x"}) {
    v1::KvSetRequest set;
    set.set_lease_id(rogue.lease_id());
    set.set_key(absl::StrCat("t/", generation, "/", key));
    set.set_value("attacker");
    v1::KvSetResponse ignored;
    grpc::Status s = Call([&](grpc::ClientContext* c) {
      return run_->cluster->worker_api().KvSet(c, set, &ignored);
    });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  run_->Fill(2);
  v1::SyncStatus st;
  ASSERT_TRUE(run_->SyncAndWait("t", 2, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run_->Verify(2, &first), 0) << first;
}

}  // namespace
}  // namespace wsync::integration
