// The rolling-waves fixture (tests of sync_rollout.cc and the held
// replicas): a real Controller on a state file, workers simulated by calls;
// one source rank feeds four replicated destination ranks.
#ifndef WSYNC_TESTS_CONTROLLER_SERVER_ROLLOUT_FIXTURE_H_
#define WSYNC_TESTS_CONTROLLER_SERVER_ROLLOUT_FIXTURE_H_

#include <errno.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shadow_extents.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/coordinator_fixture.h"

namespace wsync::controller {

constexpr int kReplicas = 4;

class SyncRolloutTest : public controller_testing::CoordinatorFixture {
 protected:
  SyncRolloutTest() {
    std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-rollout-XXXXXX");
    EXPECT_NE(mkdtemp(dir.data()), nullptr);
    store_ = std::make_unique<StateStore>(dir + "/controller.state");
    Restart();
  }

  // src/0 and dst/0..3 (each its own replica unless labelled), registered
  // through the Controller; returns the destination registrations.
  std::vector<v1::RegisterWorkerResponse> RegisterAll() {
    src_ = Join("s", "src", 0, 1).lease_id();
    tokens_[src_] = *controller_->workers().OpenStream(src_);
    std::vector<v1::RegisterWorkerResponse> out;
    dst_.clear();
    for (int r = 0; r < kReplicas; ++r) {
      out.push_back(Join(absl::StrCat("d", r), "dst", r, kReplicas));
      dst_.push_back(out.back().lease_id());
      tokens_[dst_.back()] = *controller_->workers().OpenStream(dst_.back());
    }
    return out;
  }

  v1::RegisterWorkerResponse Join(const std::string& instance, const std::string& group, int rank,
                                  int size) {
    controller_testing::Joining j;
    j.capabilities = {kStagedSyncsCapability};
    return CoordinatorFixture::Join(instance, group, rank, size, 32, j);
  }

  absl::StatusOr<v1::DefineTransferResponse> Define(
      int32_t max_unavailable, int32_t replica_ranks = 1, int32_t max_staleness = 0,
      v1::StagingMode mode = v1::STAGING_HOST_SHADOW) {
    v1::DefineTransferRequest req;
    req.set_name("t");
    req.set_source_group("src");
    req.set_destination_group("dst");
    *req.mutable_spec()->mutable_source()->add_tensors() = controller_testing::Tensor(1, true);
    *req.mutable_spec()->mutable_destination()->add_tensors() =
        controller_testing::Tensor(kReplicas, false);
    req.mutable_spec()->mutable_options()->set_disable_relay(true);
    req.mutable_spec()->mutable_staging()->set_mode(mode);
    v1::RolloutPolicy* r = req.mutable_spec()->mutable_rollout();
    r->set_max_unavailable(max_unavailable);
    r->set_replica_ranks(replica_ranks);
    r->set_max_staleness(max_staleness);
    return controller_->syncs().DefineTransfer(req);
  }

  absl::StatusOr<v1::SyncResponse> Sync(int64_t version, bool resend = false,
                                        int64_t deadline_ms = 30000) {
    v1::SyncRequest req;
    req.set_transfer("t");
    req.set_version(version);
    req.set_resend(resend);
    req.set_deadline_ms(deadline_ms);
    return controller_->syncs().StartSync(req);
  }

  // Starts `version`; the sender reports success and every receiver staged.
  void RunToDecision(int64_t version, bool resend = false, int64_t deadline_ms = 30000) {
    auto started = Sync(version, resend, deadline_ms);
    ASSERT_TRUE(started.ok()) << started.status();
    sync_id_ = started->sync_id();
    Next(src_, tokens_[src_]);
    for (const std::string& d : dst_) Next(d, tokens_[d]);
    Report(src_, false, false);
    for (const std::string& d : dst_) Report(d, /*staged=*/true, false);
    ASSERT_TRUE(Status().commit_decided());
  }

  void Report(const std::string& lease, bool staged, bool committed, int32_t code = 0) {
    ReportStaged(lease, sync_id_, staged, committed, code, code != 0 ? "commit failed" : "");
  }

  // The owner of `lease` holds syncs off (`held`) or admitted them again.
  void HeldReport(const std::string& lease, bool held) {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(sync_id_);
    r.set_commit_held(held);
    r.set_commit_admitted(!held);
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  }

  // Whether `lease` was sent CommitSync (within 30 ms).
  bool GotCommit(const std::string& lease) {
    auto a = controller_->workers().NextAssignment(lease, tokens_[lease], absl::Milliseconds(30));
    return a.ok() && a->has_value() && (**a).has_commit();
  }

  // The destination ranks sent CommitSync now.
  std::vector<int> Committing() {
    std::vector<int> out;
    for (int r = 0; r < kReplicas; ++r) {
      if (GotCommit(dst_[r])) out.push_back(r);
    }
    return out;
  }

  // Confirms every wave as it comes; `failing` reports a failed commit.
  void FinishRollout(int failing = -1) {
    for (std::vector<int> wave = Committing(); !wave.empty(); wave = Committing()) {
      for (int r : wave) {
        Report(dst_[r], false, r != failing,
               r == failing ? static_cast<int32_t>(absl::StatusCode::kInternal) : 0);
      }
    }
  }

  // wsync_replica_committed_version{transfer="t", replica}; -1 if absent.
  double CommittedMetric(const std::string& replica) {
    for (const auto& f : metrics_.registry().Collect()) {
      if (f.name != "wsync_replica_committed_version") continue;
      for (const auto& m : f.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& l : m.label) labels[l.name] = l.value;
        if (labels["transfer"] == "t" && labels["replica"] == replica) return m.gauge.value;
      }
    }
    return -1;
  }

  v1::SyncStatus Status() {
    auto st = controller_->syncs().WaitSync(sync_id_, absl::Milliseconds(1));
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::SyncStatus();
  }

  std::string src_, sync_id_;
  std::vector<std::string> dst_;
  std::map<std::string, uint64_t> tokens_;
};

}  // namespace wsync::controller

#endif  // WSYNC_TESTS_CONTROLLER_SERVER_ROLLOUT_FIXTURE_H_
