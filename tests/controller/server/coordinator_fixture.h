// The SyncCoordinator test fixture (tests/controller/server): a Controller
// with the real planner, workers simulated by calls.
#ifndef WSYNC_TESTS_CONTROLLER_SERVER_COORDINATOR_FIXTURE_H_
#define WSYNC_TESTS_CONTROLLER_SERVER_COORDINATOR_FIXTURE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "controller/server/controller.h"
#include "controller/server/state_store.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"

namespace wsync::controller::controller_testing {

// How a simulated worker registers beyond its one rank and buffer.
struct Joining {
  std::vector<std::string> capabilities;
  std::vector<v1::TransportKind> transports;
  int64_t staging_limit_bytes = 0;
  int64_t staging_budget_bytes = 0;
  std::optional<int64_t> decision_slack_ms;  // unset: as an older worker
};

class CoordinatorFixture : public ::testing::Test {
 protected:
  CoordinatorFixture() {
    config_.lease_ttl = absl::Milliseconds(300);
    config_.sync_deadline = absl::Seconds(30);
    config_.instance = "test";
    Restart();
  }

  // A fresh controller (and plan cache with `build_`'s limits) with
  // `config_`, restored from `store_` when set.
  void Restart() {
    controller_.reset();
    leases_.clear();
    plans_ = std::make_unique<PlanSource>(64, 0, build_);
    controller_ = std::make_unique<Controller>(config_, &metrics_, plans_.get(), store_.get());
    if (store_ != nullptr) {
      auto saved = store_->Load();
      ASSERT_TRUE(saved.ok()) << saved.status();
      controller_->syncs().Restore(*saved);
    }
  }

  // Rank `rank` of `group` (of `size`) with one fp32 buffer "w" of `bytes`.
  static v1::RegisterWorkerRequest Registration(const std::string& instance,
                                                const std::string& group, int rank, int size,
                                                int64_t bytes, const Joining& j = Joining()) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(instance);
    for (v1::TransportKind t : j.transports) req.add_transports(t);
    for (const std::string& c : j.capabilities) req.add_capabilities(c);
    req.set_staging_limit_bytes(j.staging_limit_bytes);
    req.set_staging_budget_bytes(j.staging_budget_bytes);
    if (j.decision_slack_ms.has_value()) req.set_decision_slack_ms(*j.decision_slack_ms);
    auto* m = req.add_memberships();
    m->set_group(group);
    m->set_rank(rank);
    m->set_group_size(size);
    auto* b = req.add_buffers();
    b->set_group(group);
    b->set_name("w");
    b->set_dtype(v1::FP32);
    b->set_bytes(bytes);
    return req;
  }

  // Registers through the registry only; the same instance again replaces
  // its lease, naming it (as the agent).
  std::string Register(const std::string& instance, const std::string& group, int rank, int size,
                       int64_t buffer_bytes, const std::vector<v1::TransportKind>& transports = {},
                       int64_t staging_limit_bytes = 0) {
    Joining j;
    j.transports = transports;
    j.staging_limit_bytes = staging_limit_bytes;
    std::string& previous = leases_[instance];
    auto resp = controller_->workers().RegisterWorker(
        Registration(instance, group, rank, size, buffer_bytes, j), "", previous);
    EXPECT_TRUE(resp.ok()) << resp.status();
    previous = resp.ok() ? resp->lease_id() : "";
    return previous;
  }

  // Registers through the Controller, as the service does (a decided
  // commit awaiting this rank is listed in the response).
  v1::RegisterWorkerResponse Join(const std::string& instance, const std::string& group, int rank,
                                  int size, int64_t bytes, const Joining& j) {
    auto resp =
        controller_->RegisterWorker(Registration(instance, group, rank, size, bytes, j), "", "");
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::RegisterWorkerResponse();
  }

  // A staged sync's report from `lease` in sync `sync_id`: `staged` (phase
  // one) or, after the decision, `committed`; `code` != 0 with `message`.
  void ReportStaged(const std::string& lease, const std::string& sync_id, bool staged,
                    bool committed, int32_t code = 0, const std::string& message = "") {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(sync_id);
    r.set_staged(staged);
    r.set_committed(committed);
    r.set_code(code);
    r.set_message(message);
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  }

  void DefineSimple() {
    auto resp = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer());
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->num_workers(), 3);
  }

  // Transfer "t"'s whole plan, as PlanTransfer answers it.
  absl::StatusOr<v1::PlanResponse> FullPlan() {
    v1::PlanRequest req;
    req.set_transfer("t");
    req.set_full(true);
    return controller_->syncs().PlanTransfer(req);
  }

  absl::StatusOr<v1::SyncResponse> StartSync(int64_t version) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(version);
    return controller_->syncs().StartSync(req);
  }

  v1::SyncAssignment Next(const std::string& lease, uint64_t token) {
    auto a = controller_->workers().NextAssignment(lease, token, absl::Seconds(1));
    EXPECT_TRUE(a.ok() && a->has_value() && (*a)->has_sync());
    return a.ok() && a->has_value() ? (**a).sync() : v1::SyncAssignment();
  }

  // Reports a successful run of `a` for `lease`.
  void ReportOk(const std::string& lease, const v1::SyncAssignment& a) {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(a.sync_id());
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  }

  // Reports a failure of `code` for `lease` in sync `sync_id`.
  void ReportFailed(const std::string& lease, const std::string& sync_id, absl::StatusCode code,
                    const std::string& message, int32_t peer = -1) {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(sync_id);
    r.set_code(static_cast<int32_t>(code));
    r.set_message(message);
    r.set_peer(peer);
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  }

  // Ticks the controller until sync `id` ended or `timeout` passed, the
  // leases in `alive` heartbeating meanwhile.
  v1::SyncStatus TickUntilEnded(const std::string& id, const std::vector<std::string>& alive,
                                absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    absl::StatusOr<v1::SyncStatus> st;
    do {
      for (const std::string& l : alive) (void)controller_->workers().Heartbeat(l);
      controller_->Tick();
      st = controller_->syncs().WaitSync(id, absl::Milliseconds(10));
      EXPECT_TRUE(st.ok()) << st.status();
    } while (st.ok() && st->phase() == v1::SYNC_RUNNING && absl::Now() < until);
    return st.ok() ? *st : v1::SyncStatus();
  }

  ControllerConfig config_;
  plan::BuildOptions build_;
  std::unique_ptr<StateStore> store_;
  ControllerMetrics metrics_;
  std::unique_ptr<PlanSource> plans_;
  std::unique_ptr<Controller> controller_;
  std::map<std::string, std::string> leases_;  // instance -> its last lease
};

}  // namespace wsync::controller::controller_testing

#endif  // WSYNC_TESTS_CONTROLLER_SERVER_COORDINATOR_FIXTURE_H_
