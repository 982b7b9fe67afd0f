// WorkerRegistry on its own: registrations, leases, streams, snapshots and
// the loss listener.
#include "controller/server/worker_registry.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistryTest() {
    config_.lease_ttl = absl::Milliseconds(200);
    config_.instance = "test";
    registry_ = std::make_unique<WorkerRegistry>(config_, nullptr);
    registry_->SetLossListener([this](const WorkerLoss& loss) {
      absl::MutexLock lock(&mu_);
      losses_.push_back(loss);
    });
  }

  static v1::RegisterWorkerRequest Request(const std::string& instance, const std::string& group,
                                           int rank, int size) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(instance);
    req.set_pid(100 + rank);
    req.set_node("node-a");
    auto* m = req.add_memberships();
    m->set_group(group);
    m->set_rank(rank);
    m->set_group_size(size);
    auto* b = req.add_buffers();
    b->set_group(group);
    b->set_name("w");
    b->set_bytes(16);
    return req;
  }

  std::string Register(const v1::RegisterWorkerRequest& req) {
    auto resp = registry_->RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->lease_id() : "";
  }

  std::vector<WorkerLoss> Losses() {
    absl::MutexLock lock(&mu_);
    return losses_;
  }

  ControllerConfig config_;
  std::unique_ptr<WorkerRegistry> registry_;
  absl::Mutex mu_;
  std::vector<WorkerLoss> losses_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerRegistryTest, DuplicateRankAndGroupSizeAreRefused) {
  const std::string first = Register(Request("a", "src", 0, 2));
  v1::RegisterWorkerRequest req = Request("b", "src", 0, 2);
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kAlreadyExists);
  req.mutable_memberships(0)->set_rank(1);
  req.mutable_memberships(0)->set_group_size(3);
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  // The same instance may register again: naming its lease, it replaces it,
  // and the old lease is reported lost.
  auto again_or = registry_->RegisterWorker(Request("a", "src", 0, 2), "", first);
  ASSERT_TRUE(again_or.ok()) << again_or.status();
  const std::string again = again_or->lease_id();
  EXPECT_NE(again, first);
  EXPECT_EQ(registry_->ListWorkers("src").workers_size(), 2);  // old one listed as dead
  EXPECT_FALSE(registry_->IsAlive(first));
  const std::vector<WorkerLoss> lost = Losses();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].lease_id, first);
  EXPECT_EQ(lost[0].reason, "replaced by a new registration");
  EXPECT_EQ(lost[0].description, "worker src/0 (pid 100 on node-a)");
}

// Issue 18: replaying a victim's (listed) instance_id took its rank and got
// its assignments; lease ids were sequential and listed.
TEST_F(WorkerRegistryTest, AnInstanceIdIsNoCredential) {
  const std::string victim = Register(Request("victim", "dst", 0, 1));
  auto replay = registry_->RegisterWorker(Request("victim", "dst", 0, 1));
  EXPECT_EQ(replay.status().code(), absl::StatusCode::kAlreadyExists) << replay.status();
  EXPECT_THAT(replay.status().message(), HasSubstr("wsync-previous-lease"));
  // Guessing a lease id does not help either.
  const std::string guess = victim.substr(0, 31) + (victim.back() == '0' ? "1" : "0");
  EXPECT_EQ(registry_->RegisterWorker(Request("victim", "dst", 0, 1), "", guess).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Nor the secret with another certificate identity.
  EXPECT_EQ(registry_->RegisterWorker(Request("victim", "dst", 0, 1), "wsync://group/other", victim)
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry_->IsAlive(victim));
  EXPECT_TRUE(Losses().empty());
}

TEST_F(WorkerRegistryTest, LeaseIdsAreRandomSecretsBoundToTheirIdentity) {
  const std::string a = Register(Request("a", "src", 0, 2));
  auto b = registry_->RegisterWorker(Request("b", "src", 1, 2), "wsync://group/src");
  ASSERT_TRUE(b.ok()) << b.status();
  for (const std::string& id : {a, b->lease_id()}) {
    EXPECT_EQ(id.size(), 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
  EXPECT_NE(a, b->lease_id());
  const v1::ListWorkersResponse listed = registry_->ListWorkers("");
  ASSERT_EQ(listed.workers_size(), 2);
  for (const auto& w : listed.workers()) {
    EXPECT_THAT(w.DebugString(), ::testing::Not(HasSubstr(a)));
    EXPECT_THAT(w.DebugString(), ::testing::Not(HasSubstr(b->lease_id())));
  }
  for (const auto& w : listed.workers()) EXPECT_TRUE(w.lease_id().empty());
  EXPECT_EQ(listed.workers(1).identity(), "wsync://group/src");
  EXPECT_TRUE(registry_->CheckCaller(b->lease_id(), "wsync://group/src", "KvSet").ok());
  absl::Status other = registry_->CheckCaller(b->lease_id(), "wsync://group/dst", "KvSet");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("wsync://group/dst"));
}

TEST_F(WorkerRegistryTest, MalformedRegistrationsAreRefused) {
  v1::RegisterWorkerRequest req = Request("", "src", 0, 1);
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  req = Request("a", "s/x", 0, 1);
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  req = Request("a", "src", 1, 1);
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  req = Request("a", "src", 0, 1);
  *req.add_memberships() = req.memberships(0);
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  req = Request("a", "src", 0, 1);
  req.set_staging_limit_bytes(-1);
  auto refused = registry_->RegisterWorker(req);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("staging_limit_bytes"));
  req = Request("a", "src", 0, 1);
  req.clear_memberships();
  EXPECT_EQ(registry_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerRegistryTest, MissedHeartbeatsExpireTheLeaseOnce) {
  const std::string kept = Register(Request("a", "src", 0, 2));
  const std::string silent = Register(Request("b", "src", 1, 2));
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (absl::Now() < until && registry_->IsAlive(silent)) {
    ASSERT_TRUE(registry_->Heartbeat(kept).ok());
    registry_->Tick();
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(registry_->IsAlive(silent));
  EXPECT_TRUE(registry_->IsAlive(kept));
  EXPECT_EQ(registry_->Heartbeat(silent).status().code(), absl::StatusCode::kNotFound);
  registry_->Tick();
  const std::vector<WorkerLoss> lost = Losses();
  ASSERT_EQ(lost.size(), 1u) << "reported once";
  EXPECT_EQ(lost[0].lease_id, silent);
  EXPECT_THAT(lost[0].reason, HasSubstr("lease expired"));
  // The group's rank 1 is free again.
  const WorkerRegistry::Group g = registry_->FindGroup("src");
  ASSERT_EQ(g.size, 2);
  ASSERT_TRUE(g.ranks[0].has_value());
  EXPECT_EQ(g.ranks[0]->lease_id, kept);
  EXPECT_FALSE(g.ranks[1].has_value());
  const WorkerRegistry::Counts counts = registry_->CountWorkers();
  EXPECT_EQ(counts.registered, 2);
  EXPECT_EQ(counts.alive, 1);
}

TEST_F(WorkerRegistryTest, StreamsDeliverInOrderAndEndWhenReplacedOrClosed) {
  const std::string lease = Register(Request("a", "src", 0, 1));
  auto first = registry_->OpenStream(lease);
  ASSERT_TRUE(first.ok());
  v1::Assignment a;
  a.mutable_abort()->set_sync_id("s1");
  ASSERT_TRUE(registry_->Push(lease, a));
  a.mutable_abort()->set_sync_id("s2");
  ASSERT_TRUE(registry_->Push(lease, a));
  for (const char* id : {"s1", "s2"}) {
    auto next = registry_->NextAssignment(lease, *first, absl::Seconds(1));
    ASSERT_TRUE(next.ok() && next->has_value());
    EXPECT_EQ((**next).abort().sync_id(), id);
  }
  auto none = registry_->NextAssignment(lease, *first, absl::Milliseconds(10));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto second = registry_->OpenStream(lease);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(registry_->NextAssignment(lease, *first, absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kAborted);
  registry_->CloseStream(lease, *first, "stale token");  // not the open stream: ignored
  EXPECT_TRUE(registry_->IsAlive(lease));
  registry_->CloseStream(lease, *second, "worker disconnected");
  EXPECT_FALSE(registry_->IsAlive(lease));
  EXPECT_FALSE(registry_->Push(lease, a));
  EXPECT_EQ(registry_->NextAssignment(lease, *second, absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kNotFound);
  const std::vector<WorkerLoss> lost = Losses();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, "assignment stream closed: worker disconnected");
}

TEST_F(WorkerRegistryTest, SnapshotsKeepTheListTheyWereMadeWith) {
  const std::string lease = Register(Request("a", "src", 0, 1));
  std::optional<WorkerSnapshot> before = registry_->Find(lease);
  ASSERT_TRUE(before.has_value());
  v1::UpdateBuffersRequest update;
  update.set_lease_id(lease);
  v1::BufferInfo* b = update.add_buffers();
  b->set_group("src");
  b->set_name("w");
  b->set_bytes(64);
  ASSERT_TRUE(registry_->UpdateBuffers(update).ok());
  std::optional<WorkerSnapshot> after = registry_->Find(lease);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(before->info->buffers(0).bytes(), 16);
  EXPECT_EQ(after->info->buffers(0).bytes(), 64);
  EXPECT_GT(after->registration, before->registration);
  EXPECT_FALSE(after->direct_writes_unavailable);
  registry_->MarkDirectWritesUnavailable(lease);
  EXPECT_TRUE(registry_->Find(lease)->direct_writes_unavailable);
  update.set_lease_id("nobody");
  EXPECT_EQ(registry_->UpdateBuffers(update).code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, APartIsMarkedSentOncePerLease) {
  const std::string a = Register(Request("a", "src", 0, 2));
  const std::string b = Register(Request("b", "src", 1, 2));
  EXPECT_TRUE(registry_->MarkPartSent(a, "k/0"));
  EXPECT_FALSE(registry_->MarkPartSent(a, "k/0"));
  EXPECT_TRUE(registry_->MarkPartSent(a, "k/0/pw:to=1;by="));
  EXPECT_TRUE(registry_->MarkPartSent(b, "k/0"));
}

// ReportResultRequest.dropped_part_keys reaches ForgetPartSent with the
// reporter's own lease (admitted first): hostile keys only make that lease
// receive its own parts again; another lease, or unknown leases and keys,
// change nothing.
TEST_F(WorkerRegistryTest, ForgettingPartsTouchesOnlyTheNamedLeasesKnownParts) {
  const std::string a = Register(Request("a", "src", 0, 2));
  const std::string b = Register(Request("b", "src", 1, 2));
  EXPECT_TRUE(registry_->MarkPartSent(a, "k/0"));
  EXPECT_TRUE(registry_->MarkPartSent(b, "k/1"));
  for (int i = 0; i < 100000; ++i) registry_->ForgetPartSent(b, absl::StrCat("junk/", i));
  registry_->ForgetPartSent(b, std::string(1 << 20, 'x'));
  registry_->ForgetPartSent("no-such-lease", "k/0");
  registry_->ForgetPartSent(b, "k/0");  // a's part, named by b
  EXPECT_FALSE(registry_->MarkPartSent(a, "k/0")) << "a's part stays sent";
  EXPECT_FALSE(registry_->MarkPartSent(b, "k/1")) << "b's own part untouched by junk keys";
  registry_->ForgetPartSent(b, "k/1");
  EXPECT_TRUE(registry_->MarkPartSent(b, "k/1")) << "a dropped part is sent again";
}

TEST_F(WorkerRegistryTest, ListWorkersShowsStagingLimitAndTransports) {
  v1::RegisterWorkerRequest req = Request("a", "src", 0, 1);
  req.set_staging_limit_bytes(1 << 20);
  req.add_transports(v1::TRANSPORT_NCCL);
  Register(req);
  const v1::ListWorkersResponse resp = registry_->ListWorkers("");
  ASSERT_EQ(resp.workers_size(), 1);
  EXPECT_EQ(resp.workers(0).staging_limit_bytes(), 1 << 20);
  EXPECT_THAT(resp.workers(0).transports(), ElementsAre(v1::TRANSPORT_NCCL));
  EXPECT_TRUE(resp.workers(0).alive());
  EXPECT_EQ(registry_->ListWorkers("other").workers_size(), 0);
}

TEST_F(WorkerRegistryTest, ShutdownEndsStreams) {
  const std::string lease = Register(Request("a", "src", 0, 1));
  auto token = registry_->OpenStream(lease);
  ASSERT_TRUE(token.ok());
  registry_->Shutdown();
  EXPECT_EQ(registry_->NextAssignment(lease, *token, absl::Seconds(5)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry_->RegisterWorker(Request("b", "dst", 0, 1)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace wsync::controller
