// Staged syncs through real agents and a real controller in-process (host
// backend, loopback): the owner's hold against a commit that has just begun,
// a lost commit_held report, and STAGED read by every owner before the
// controller counts a receiver staged (docs/staging.md, "The owner's view",
// "An owner holding syncs off"). One source rank feeds two 1-rank replicas
// of a replicated tensor, committed one wave at a time (max_unavailable 1).
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "controller/server/server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"
#include "worker/agent/agent.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

using ::testing::HasSubstr;
constexpr int kElems = 256;

// One agent, its tensor "w" and an owner reading its events at once.
struct Node {
  ~Node() { StopReading(); }
  void Read() {
    events = agent->Subscribe();
    reader = std::thread([this] {
      v1::SyncEvent e;
      while (!done.HasBeenNotified()) {
        if (!events->Pop(&e, absl::Milliseconds(20))) continue;
        absl::MutexLock lock(&mu);
        seen.push_back(e);
      }
    });
  }
  void StopReading() {
    if (!reader.joinable()) return;
    done.Notify();
    reader.join();
    agent->Unsubscribe(events);
  }
  // Whether an event of `kind` was read within `wait`.
  bool Saw(v1::SyncEvent::Kind kind, absl::Duration wait) {
    absl::MutexLock lock(&mu);
    auto has = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
      for (const v1::SyncEvent& e : seen) {
        if (e.kind() == kind) return true;
      }
      return false;
    };
    return mu.AwaitWithTimeout(absl::Condition(&has), wait);
  }

  std::unique_ptr<host::HostBackend> backend;
  std::unique_ptr<WorkerAgent> agent;
  std::vector<float> w = std::vector<float>(kElems, 0.0f);
  std::shared_ptr<EventQueue> events;
  std::thread reader;
  absl::Notification done;
  absl::Mutex mu;
  std::vector<v1::SyncEvent> seen ABSL_GUARDED_BY(mu);
};

class AgentHeldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    controller::ServerOptions so;
    so.listen_address = "127.0.0.1:0";
    so.metrics_address = "";
    so.auth.insecure = true;  // security is not the subject
    so.config.instance = "agent-held-test";
    so.config.lease_ttl = absl::Seconds(4);  // heartbeats about every second
    auto server = controller::ControllerServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    trainer_ = v1::TrainerService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    for (auto& n : nodes_) {
      n->StopReading();
      n->agent->Stop();
    }
    if (server_ != nullptr) server_->Shutdown();
  }

  // Source rank 0 (weights 1..n) and destination ranks 0, 1; `tweak` edits
  // each destination's options (index 1, 2).
  void StartNodes(const std::function<void(int, AgentOptions&)>& tweak) {
    for (int i = 0; i < 3; ++i) {
      nodes_.push_back(std::make_unique<Node>());
      Node& n = *nodes_.back();
      n.backend = std::make_unique<host::HostBackend>(plane::BackendConfig());
      AgentOptions o;
      o.controller = address_;
      v1::Membership m;
      m.set_group(i == 0 ? "src" : "dst");
      m.set_rank(i == 0 ? 0 : i - 1);
      m.set_group_size(i == 0 ? 1 : 2);
      o.memberships = {m};
      o.instance_id = absl::StrCat("agent-held-", i);
      o.backend = n.backend.get();
      o.decision_slack = absl::Seconds(1);
      if (i > 0) tweak(i, o);
      if (i == 0) {
        for (int e = 0; e < kElems; ++e) n.w[e] = static_cast<float>(e + 1);
      }
      n.agent = std::make_unique<WorkerAgent>(o, nullptr);
      n.agent->Start();
      LocalTensor t;
      t.reg.set_name("w");
      t.reg.set_dtype(v1::FP32);
      t.reg.add_shape(kElems);
      t.data = n.w.data();
      t.bytes = kElems * 4;
      std::vector<LocalTensor> list;
      list.push_back(std::move(t));
      ASSERT_TRUE(n.agent->RegisterLocal(m.group(), std::move(list), false).ok());
    }
    for (auto& n : nodes_) {
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (!n->agent->Status().registered() && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      ASSERT_TRUE(n->agent->Status().registered());
    }
    v1::DefineTransferRequest req;
    req.set_name("t");
    req.set_source_group("src");
    req.set_destination_group("dst");
    *req.mutable_spec()->mutable_source()->add_tensors() =
        controller::controller_testing::Tensor(1, true, kElems);
    *req.mutable_spec()->mutable_destination()->add_tensors() =
        controller::controller_testing::Tensor(2, false, kElems);
    req.mutable_spec()->mutable_options()->set_disable_relay(true);
    req.mutable_spec()->mutable_staging()->set_mode(v1::STAGING_HOST_SHADOW);
    req.mutable_spec()->mutable_rollout()->set_max_unavailable(1);
    req.mutable_spec()->mutable_rollout()->set_replica_ranks(1);
    grpc::ClientContext ctx;
    v1::DefineTransferResponse resp;
    const grpc::Status s = trainer_->DefineTransfer(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // Starts version `v` (retried while the workers' buffers are on their
  // way); returns its sync id.
  std::string Sync(int64_t v, int64_t deadline_ms) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    grpc::Status s;
    while (absl::Now() < until) {
      grpc::ClientContext ctx;
      v1::SyncRequest req;
      req.set_transfer("t");
      req.set_version(v);
      req.set_deadline_ms(deadline_ms);
      v1::SyncResponse resp;
      s = trainer_->Sync(&ctx, req, &resp);
      if (s.ok()) return resp.sync_id();
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "Sync: " << s.error_message();
    return "";
  }

  v1::SyncStatus Wait(const std::string& id, absl::Duration timeout) {
    grpc::ClientContext ctx;
    v1::WaitSyncRequest req;
    req.set_sync_id(id);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    v1::SyncStatus st;
    const grpc::Status s = trainer_->WaitSync(&ctx, req, &st);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return st;
  }

  bool Holds(int i, float want) {
    for (float x : nodes_[i]->w) {
      if (x != want) return false;
    }
    return true;
  }

  std::unique_ptr<controller::ControllerServer> server_;
  std::string address_;
  std::unique_ptr<v1::TrainerService::Stub> trainer_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

// Session 16's gap: a commit_held report was sent once; lost, the held
// replica counted as committing and held the next waves back until the
// deadline. The worker now says it again every heartbeat interval.
TEST_F(AgentHeldTest, ALostHeldReportIsRepeatedSoTheHeldReplicaHoldsNoWaveBack) {
  StartNodes([](int i, AgentOptions& o) {
    if (i == 1) o.test_drop_held_reports = 1;  // the first is lost on its way
  });
  for (int i : {1, 2}) nodes_[i]->Read();
  ASSERT_TRUE(nodes_[1]->agent->HoldSyncs("generating").ok());
  const absl::Time start = absl::Now();
  const std::string id = Sync(1, /*deadline_ms=*/20000);
  // dst/1's wave goes out once dst/0 is known held, long before the deadline.
  ASSERT_TRUE(nodes_[2]->Saw(v1::SyncEvent::COMMITTED, absl::Seconds(8)))
      << "the held replica held the next wave back";
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_FALSE(nodes_[1]->Saw(v1::SyncEvent::COMMIT, absl::ZeroDuration()));
  EXPECT_TRUE(Holds(1, 0.0f)) << "a held owner's tensor was written";
  ASSERT_TRUE(nodes_[1]->agent->HoldSyncs("").ok());
  ASSERT_TRUE(nodes_[1]->Saw(v1::SyncEvent::COMMITTED, absl::Seconds(8)));
  const v1::SyncStatus st = Wait(id, absl::Seconds(10));
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_TRUE(st.uncommitted().empty());
  for (int e = 0; e < kElems; ++e) ASSERT_EQ(nodes_[1]->w[e], e + 1.0f) << e;
}

// Session 16's gap: a hold that came after the worker found no hold (the
// commit had begun) returned at once while the worker copied. It now waits
// for that commit and names it.
TEST_F(AgentHeldTest, AHoldDuringACommitThatBeganWaitsForItAndNamesIt) {
  StartNodes([](int, AgentOptions& o) { o.test_commit_delay = absl::Milliseconds(500); });
  for (int i : {1, 2}) nodes_[i]->Read();
  const std::string id = Sync(1, 20000);
  ASSERT_TRUE(nodes_[1]->Saw(v1::SyncEvent::COMMIT, absl::Seconds(10)));
  auto began = nodes_[1]->agent->HoldSyncs("generating");  // the copy is under way
  ASSERT_TRUE(began.ok()) << began.status();
  EXPECT_EQ(*began, id) << "the hold did not wait for the commit in progress";
  for (int e = 0; e < kElems; ++e) ASSERT_EQ(nodes_[1]->w[e], e + 1.0f) << "copy not ended: " << e;
  EXPECT_TRUE(nodes_[1]->Saw(v1::SyncEvent::COMMITTED, absl::Seconds(5)));
  ASSERT_TRUE(nodes_[1]->agent->HoldSyncs("").ok());
  EXPECT_EQ(Wait(id, absl::Seconds(10)).phase(), v1::SYNC_SUCCEEDED);
}

// Session 16's gap: the worker reported `staged` while its owner's STAGED
// sat unread in a queue. Now an owner that does not read STAGED within
// --staged_flush_timeout fails the sync before the decision: nothing
// commits anywhere.
TEST_F(AgentHeldTest, AnOwnerThatDoesNotReadStagedFailsTheSyncAndNothingCommits) {
  StartNodes([](int, AgentOptions& o) { o.staged_flush_timeout = absl::Milliseconds(300); });
  nodes_[1]->Read();  // one owner reads, the other never does
  auto deaf = nodes_[1]->agent->Subscribe("deaf test owner");
  nodes_[2]->Read();
  const std::string id = Sync(1, 20000);
  const v1::SyncStatus st = Wait(id, absl::Seconds(15));
  EXPECT_EQ(st.phase(), v1::SYNC_FAILED);
  EXPECT_FALSE(st.commit_decided());
  EXPECT_THAT(st.error(), HasSubstr("--staged_flush_timeout"));
  // The error names the owner that did not read, not only a count.
  EXPECT_THAT(st.error(), HasSubstr("1 of 2 owner(s)"));
  EXPECT_THAT(st.error(), HasSubstr("owner #2 (deaf test owner, subscribed at "));
  EXPECT_TRUE(Holds(1, 0.0f));
  EXPECT_TRUE(Holds(2, 0.0f)) << "a replica committed while an owner did not hear STAGED";
  nodes_[1]->agent->Unsubscribe(deaf);
  // Every owner reads now: the next sync commits.
  const std::string again = Sync(2, 20000);
  EXPECT_EQ(Wait(again, absl::Seconds(15)).phase(), v1::SYNC_SUCCEEDED);
  for (int e = 0; e < kElems; ++e) ASSERT_EQ(nodes_[2]->w[e], e + 1.0f) << e;
}

}  // namespace
}  // namespace wsync::agent
