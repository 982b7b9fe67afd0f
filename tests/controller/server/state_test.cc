// ControllerState without gRPC: the real planner, workers simulated by calls.
#include "controller/server/state.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/state_test_util.h"

namespace wsync::controller {
namespace {

class StateTest : public ::testing::Test {
 protected:
  StateTest() {
    config_.lease_ttl = absl::Milliseconds(300);
    config_.sync_deadline = absl::Seconds(30);
    config_.instance = "test";
    state_ = std::make_unique<ControllerState>(config_, &metrics_, &plans_);
  }

  std::string Register(const std::string& instance, const std::string& group, int rank, int size,
                       int64_t buffer_bytes, const std::vector<std::string>& capabilities = {}) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(instance);
    for (const std::string& c : capabilities) req.add_capabilities(c);
    auto* m = req.add_memberships();
    m->set_group(group);
    m->set_rank(rank);
    m->set_group_size(size);
    auto* b = req.add_buffers();
    b->set_group(group);
    b->set_name("w");
    b->set_dtype(v1::FP32);
    b->set_bytes(buffer_bytes);
    auto resp = state_->RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->lease_id() : "";
  }

  void DefineSimple() {
    auto resp = state_->DefineTransfer(state_testing::SimpleTransfer());
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->num_workers(), 3);
  }

  absl::StatusOr<v1::SyncResponse> StartSync(int64_t version) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(version);
    return state_->StartSync(req);
  }

  v1::SyncAssignment Next(const std::string& lease, uint64_t token) {
    auto a = state_->NextAssignment(lease, token, absl::Seconds(1));
    EXPECT_TRUE(a.ok() && a->has_value() && (*a)->has_sync());
    return a.ok() && a->has_value() ? (**a).sync() : v1::SyncAssignment();
  }

  ControllerConfig config_;
  ControllerMetrics metrics_;
  PlanSource plans_;
  std::unique_ptr<ControllerState> state_;
};

TEST_F(StateTest, DuplicateRankAndGroupSizeAreRefused) {
  Register("a", "src", 0, 2, 16);
  v1::RegisterWorkerRequest req;
  req.set_instance_id("b");
  auto* m = req.add_memberships();
  m->set_group("src");
  m->set_rank(0);
  m->set_group_size(2);
  EXPECT_EQ(state_->RegisterWorker(req).status().code(), absl::StatusCode::kAlreadyExists);
  m->set_rank(1);
  m->set_group_size(3);
  EXPECT_EQ(state_->RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  // The same instance may register again (it replaces its lease).
  const std::string again = Register("a", "src", 0, 2, 16);
  EXPECT_FALSE(again.empty());
  EXPECT_EQ(state_->ListWorkers("src").workers_size(), 2);  // old one listed as dead
}

TEST_F(StateTest, SyncSendsOpListOncePerPlanKeyAndVersionsMoveForward) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *state_->OpenStream(l);
  DefineSimple();
  for (int64_t v = 1; v <= 2; ++v) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(v);
    auto started = state_->StartSync(req);
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_TRUE(started->plan_cache_hit());
    for (const auto& l : {s0, s1, d0}) {
      v1::SyncAssignment a = Next(l, tokens[l]);
      EXPECT_EQ(a.has_plan(), v == 1) << "op list only with the first sync of a plan key";
      EXPECT_EQ(a.version(), v);
      v1::ReportResultRequest r;
      r.set_lease_id(l);
      r.set_sync_id(a.sync_id());
      ASSERT_TRUE(state_->ReportResult(r).ok());
    }
    auto st = state_->WaitSync(started->sync_id(), absl::Seconds(1));
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->phase(), v1::SYNC_SUCCEEDED) << st->error();
  }
  v1::SyncRequest old;
  old.set_transfer("t");
  old.set_version(2);
  EXPECT_EQ(state_->StartSync(old).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plans_.misses(), 1);
}

TEST_F(StateTest, TransportIsNcclWhenEveryWorkerRunsTheGpuPlane) {
  const std::vector<std::string> gpu = {"nccl", "cuda_ipc"};
  const std::string s0 = Register("a", "src", 0, 2, 16, gpu);
  const std::string s1 = Register("b", "src", 1, 2, 16, gpu);
  const std::string d0 = Register("c", "dst", 0, 1, 32, gpu);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *state_->OpenStream(l);
  DefineSimple();
  ASSERT_TRUE(StartSync(1).ok());
  for (const auto& l : {s0, s1, d0}) {
    const v1::SyncAssignment a = Next(l, tokens[l]);
    ASSERT_TRUE(a.has_transport());
    EXPECT_EQ(a.transport().kind(), "nccl");
    EXPECT_EQ(a.transport().size(), 3);
  }
}

TEST_F(StateTest, WorkersWithoutACommonTransportFailTheSyncNamingBoth) {
  const std::vector<std::string> gpu = {"nccl", "cuda_ipc"};
  const std::string s0 = Register("a", "src", 0, 2, 16, gpu);
  const std::string s1 = Register("b", "src", 1, 2, 16, gpu);
  const std::string d0 = Register("c", "dst", 0, 1, 32, {"gloo"});
  for (const auto& l : {s0, s1, d0}) ASSERT_TRUE(state_->OpenStream(l).ok());
  DefineSimple();
  auto started = StartSync(1);
  ASSERT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition) << started.status();
  const std::string msg(started.status().message());
  EXPECT_NE(msg.find("src/0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dst/0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device"), std::string::npos) << msg;
}

TEST_F(StateTest, FirstErrorFailsSyncAndAbortsTheOthers) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  std::map<std::string, uint64_t> tokens;
  for (const auto& l : {s0, s1, d0}) tokens[l] = *state_->OpenStream(l);
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  auto started = state_->StartSync(req);
  ASSERT_TRUE(started.ok()) << started.status();
  for (const auto& l : {s0, s1, d0}) Next(l, tokens[l]);
  v1::ReportResultRequest r;
  r.set_lease_id(d0);
  r.set_sync_id(started->sync_id());
  r.set_code(static_cast<int>(absl::StatusCode::kInternal));
  r.set_message("disk on fire");
  r.set_round(0);
  r.set_peer(1);
  ASSERT_TRUE(state_->ReportResult(r).ok());
  auto st = state_->WaitSync(started->sync_id(), absl::Seconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st->failed_group(), "dst");
  EXPECT_EQ(st->failed_rank(), 0);
  EXPECT_EQ(st->failed_peer(), 1);
  EXPECT_NE(st->error().find("disk on fire"), std::string::npos);
  for (const auto& l : {s0, s1}) {
    auto a = state_->NextAssignment(l, tokens[l], absl::Seconds(1));
    ASSERT_TRUE(a.ok() && a->has_value());
    EXPECT_TRUE((*a)->has_abort());
  }
  // The failed version was not recorded: it may be retried.
  auto retry = state_->StartSync(req);
  EXPECT_TRUE(retry.ok()) << retry.status();
}

TEST_F(StateTest, MissedHeartbeatsExpireTheLeaseAndFailTheSync) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  const std::string s1 = Register("b", "src", 1, 2, 16);
  const std::string d0 = Register("c", "dst", 0, 1, 32);
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  auto started = state_->StartSync(req);
  ASSERT_TRUE(started.ok()) << started.status();
  // s0 and d0 keep heartbeating; s1 is silent.
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (absl::Now() < until) {
    ASSERT_TRUE(state_->Heartbeat(s0).ok());
    ASSERT_TRUE(state_->Heartbeat(d0).ok());
    state_->Tick();
    auto st = state_->WaitSync(started->sync_id(), absl::Milliseconds(20));
    if (st.ok() && st->phase() != v1::SYNC_RUNNING) break;
  }
  auto st = state_->WaitSync(started->sync_id(), absl::Milliseconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED);
  EXPECT_EQ(st->failed_group(), "src");
  EXPECT_EQ(st->failed_rank(), 1);
  EXPECT_NE(st->error().find("lease expired"), std::string::npos) << st->error();
  EXPECT_EQ(state_->Heartbeat(s1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StateTest, RendezvousKeysLiveInTheGenerationScope) {
  const std::string s0 = Register("a", "src", 0, 2, 16);
  Register("b", "src", 1, 2, 16);
  Register("c", "dst", 0, 1, 32);
  DefineSimple();
  v1::SyncRequest req;
  req.set_transfer("t");
  req.set_version(1);
  ASSERT_TRUE(state_->StartSync(req).ok());
  v1::KvSetRequest set;
  set.set_lease_id(s0);
  set.set_key("t/1/rank0");
  set.set_value("addr");
  ASSERT_TRUE(state_->KvSet(set).ok());
  set.set_key("t/7/rank0");
  EXPECT_EQ(state_->KvSet(set).code(), absl::StatusCode::kFailedPrecondition);
  v1::KvGetRequest get;
  get.set_lease_id(s0);
  get.add_keys("t/1/rank0");
  auto got = state_->KvGet(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->values(0), "addr");
  get.add_keys("t/1/rank1");
  get.set_timeout_ms(50);
  auto missing = state_->KvGet(get);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("t/1/rank1"), std::string::npos);
}

}  // namespace
}  // namespace wsync::controller
