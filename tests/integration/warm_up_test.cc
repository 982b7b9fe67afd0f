// Warm-ups through the real binaries (docs/warm-up.md): a transfer's workers
// build their channel when it is defined, its first sync reuses it, and the
// warm-up writes nothing and applies no version.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/integration/http_get.h"
#include "tools/demo/owner.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;

// The value of the unlabelled series `name` in a /metrics text (-1: absent).
double Series(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
}

std::vector<int> AllWorkers(const CaseRun& run) {
  std::vector<int> out = run.src_worker;
  out.insert(out.end(), run.dst_worker.begin(), run.dst_worker.end());
  return out;
}

// Every worker's count of channels built so far.
std::vector<double> ChannelsCreated(CaseRun& run) {
  std::vector<double> out;
  for (int w : AllWorkers(run)) {
    out.push_back(Series(HttpGet(run.cluster->worker(w).metrics_port, "/metrics"),
                         "wsync_worker_channels_created_total"));
  }
  return out;
}

v1::TransferStatus StatusOf(CaseRun& run, const std::string& name) {
  v1::GetStatusRequest req;
  v1::GetStatusResponse resp;
  EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, req, &resp);
              }).ok());
  for (const v1::TransferStatus& t : resp.transfers()) {
    if (t.name() == name) return t;
  }
  return v1::TransferStatus();
}

// Waits until transfer `name`'s warm-up left RUNNING (or 30 s passed).
v1::WarmUpStatus AwaitWarmUp(CaseRun& run, const std::string& name) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  v1::TransferStatus t = StatusOf(run, name);
  while (t.warm_up().state() == v1::WARM_UP_RUNNING && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
    t = StatusOf(run, name);
  }
  return t.warm_up();
}

grpc::Status DefineWith(CaseRun& run, const std::string& name, bool no_warm_up,
                        v1::DefineTransferResponse* resp) {
  v1::DefineTransferRequest req;
  req.set_name(name);
  req.set_source_group("trainer");
  req.set_destination_group("inference");
  *req.mutable_spec() = run.spec;
  req.set_no_warm_up(no_warm_up);
  return Call(
      [&](grpc::ClientContext* c) { return run.cluster->trainer().DefineTransfer(c, req, resp); });
}

TEST(WarmUpIntegration, TheFirstSyncReusesTheChannelsTheWarmUpBuilt) {
  auto started = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(started.ok()) << started.status();
  CaseRun& run = **started;
  run.Fill(1);  // sources hold version 1, destinations poisoned
  v1::DefineTransferResponse defined;
  grpc::Status s = DefineWith(run, "t", /*no_warm_up=*/false, &defined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_FALSE(defined.warm_up_id().empty());
  const v1::WarmUpStatus warm = AwaitWarmUp(run, "t");
  ASSERT_EQ(warm.state(), v1::WARM_UP_WARM) << warm.reason();
  EXPECT_EQ(warm.workers_done(), 4);
  // Each worker built its channel once, in the warm-up.
  const std::vector<double> after_warm_up = ChannelsCreated(run);
  for (double n : after_warm_up) EXPECT_EQ(n, 1);
  // Nothing written, nothing applied, nothing recorded as a sync.
  std::string first;
  EXPECT_GT(run.Verify(1, &first), 0) << "the destinations are still poisoned";
  for (int w : AllWorkers(run)) {
    grpc::ClientContext ctx;
    v1::LocalStatusResponse local;
    ASSERT_TRUE(demo::LocalStub(run.cluster->worker(w).socket)
                    ->Status(&ctx, v1::LocalStatusRequest(), &local)
                    .ok());
    EXPECT_EQ(local.last_version(), 0);
    EXPECT_EQ(local.syncs_ok() + local.syncs_failed(), 0);
  }
  v1::TransferStatus ts = StatusOf(run, "t");
  EXPECT_EQ(ts.last_success_version(), 0);
  EXPECT_FALSE(ts.has_last_sync());

  v1::SyncStatus st;
  s = run.SyncAndWait("t", 1, &st);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  first.clear();
  EXPECT_EQ(run.Verify(1, &first), 0) << first;
  EXPECT_THAT(st.warm_up(), HasSubstr("warm (warm-up " + defined.warm_up_id()));
  EXPECT_EQ(ChannelsCreated(run), after_warm_up) << "the first sync built no channel";
  EXPECT_LT(st.max_setup_seconds(), 0.05) << "the transport was connected already";
}

TEST(WarmUpIntegration, ASyncStartedRightAfterTheDefinitionWaitsForTheWarmUp) {
  auto started = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(started.ok()) << started.status();
  CaseRun& run = **started;
  v1::DefineTransferResponse defined;
  grpc::Status s = DefineWith(run, "t", /*no_warm_up=*/false, &defined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  run.Fill(1);
  v1::SyncStatus st;
  s = run.SyncAndWait("t", 1, &st);  // no wait for the warm-up
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;
  EXPECT_EQ(StatusOf(run, "t").warm_up().state(), v1::WARM_UP_WARM);
  // Either it waited for the warm-up, or that had ended already.
  EXPECT_THAT(st.warm_up(), HasSubstr("warm (warm-up " + defined.warm_up_id()));
  for (double n : ChannelsCreated(run)) EXPECT_EQ(n, 1) << "one channel: the warm-up's";
}

TEST(WarmUpIntegration, WithoutAWarmUpTheFirstSyncBuildsItsChannels) {
  auto started = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(started.ok()) << started.status();
  CaseRun& run = **started;
  v1::DefineTransferResponse defined;
  grpc::Status s = DefineWith(run, "cold", /*no_warm_up=*/true, &defined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(defined.warm_up_id(), "");
  EXPECT_EQ(StatusOf(run, "cold").warm_up().state(), v1::WARM_UP_OFF);
  for (double n : ChannelsCreated(run)) EXPECT_EQ(n, 0);
  run.Fill(1);
  v1::SyncStatus st;
  s = run.SyncAndWait("cold", 1, &st);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  for (double n : ChannelsCreated(run)) EXPECT_EQ(n, 1);
  EXPECT_EQ(st.warm_up(), "");
}

}  // namespace
}  // namespace wsync::integration
