// wsyncctl's operator commands (status, workers, sync, watch, cancel) run as
// a subprocess against a real controller and two host workers on loopback.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/tools/run_ctl.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Result = tools_testing::CtlResult;
using tools_testing::RunShell;

// Stdin empty: a command that would read it does not wait on the test's.
Result RunCtl(const std::string& args, bool merge = true) {
  return tools_testing::RunCtl(args + " </dev/null", merge);
}

// What `wsyncctl <command> <args>` should exit with and say.
struct Expected {
  std::string command;
  std::string args;
  int code;  // 0: done; 1: the call failed; 2: bad usage
  std::vector<std::string> says;
};

// Runs each of `cases` through `run` (command, args) and checks it.
template <typename Run>
void ExpectRuns(const std::vector<Expected>& cases, Run run) {
  for (const Expected& c : cases) {
    Result r = run(c.command, c.args);
    EXPECT_EQ(r.code, c.code) << c.command << " " << c.args << ": " << r.out;
    for (const std::string& text : c.says) {
      EXPECT_THAT(r.out, HasSubstr(text)) << c.command << " " << c.args;
    }
  }
}

// A tiny-llama case between one trainer worker and one inference worker,
// transfer "t" defined; `ctl` prefixes every command with --controller.
class WsyncctlClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    demo::ClusterOptions options = DefaultClusterOptions();
    options.lease_ttl = absl::Seconds(30);  // a frozen worker keeps its lease
    auto run = CaseRun::Start(Case("fsdp:1", "vllm-tp:1"), options);
    ASSERT_TRUE(run.ok()) << run.status();
    run_ = *std::move(run);
    ASSERT_TRUE(run_->Define("t").ok());
  }

  Result Ctl(const std::string& command, const std::string& args, bool merge = true) {
    return RunCtl(
        absl::StrCat(command, " --controller ", run_->cluster->controller_address(), " ", args),
        merge);
  }

  // Fills version `version` and stops inference/0 (SIGSTOP, its lease
  // kept): a sync then runs until cancelled or past its deadline. Returns
  // its pid (-1 when it did not stop) for the SIGCONT.
  pid_t FillAndFreezeDestination(int64_t version) {
    run_->Fill(version);
    const pid_t victim = run_->cluster->worker(run_->dst_worker[0]).child.pid();
    return Freeze(victim) ? victim : -1;
  }

  std::unique_ptr<CaseRun> run_;
};

TEST_F(WsyncctlClusterTest, StatusAndWorkersShowTheClusterAsTableAndJson) {
  Result r = Ctl("status", "");
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("2 workers registered, 2 alive"));
  EXPECT_THAT(r.out, HasSubstr("trainer -> inference"));
  r = Ctl("status", "--json", /*merge=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  v1::GetStatusResponse status;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &status).ok()) << r.out;
  ASSERT_EQ(status.transfers_size(), 1);
  EXPECT_EQ(status.transfers(0).name(), "t");
  EXPECT_EQ(status.workers_alive(), 2);

  r = Ctl("workers", "");
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("trainer/0"));
  EXPECT_THAT(r.out, HasSubstr("inference/0"));
  const std::string inference_pid =
      absl::StrCat(run_->cluster->worker(run_->dst_worker[0]).child.pid());
  EXPECT_THAT(r.out, HasSubstr(inference_pid));
  r = Ctl("workers", "--group inference --json", /*merge=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &workers).ok()) << r.out;
  ASSERT_EQ(workers.workers_size(), 1) << r.out;
  EXPECT_EQ(absl::StrCat(workers.workers(0).pid()), inference_pid);
  EXPECT_TRUE(workers.workers(0).streaming());
  EXPECT_TRUE(workers.workers(0).alive());
}

TEST_F(WsyncctlClusterTest, SyncWaitDeliversAndPrintsTheVersionAndRoundTrip) {
  run_->Fill(1);
  Result r = Ctl("sync", "t 1 --wait");
  std::printf("%s", r.out.c_str());  // the outcome and round trip, for the log
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("transfer 't' version 1 SUCCEEDED"));
  EXPECT_THAT(r.out, HasSubstr("round trip"));
  std::string first;
  EXPECT_EQ(run_->Verify(1, &first), 0) << first;

  run_->Fill(2);
  r = Ctl("sync", "t 2 --wait=30s --deadline 20s --json", /*merge=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &json).ok()) << r.out;
  EXPECT_EQ(json.fields().at("phase").string_value(), "SYNC_SUCCEEDED") << r.out;
  EXPECT_EQ(json.fields().at("version").string_value(), "2") << r.out;
  EXPECT_GT(json.fields().at("round_trip_ms").number_value(), 0) << r.out;
  EXPECT_EQ(run_->Verify(2, &first), 0) << first;

  r = Ctl("status", "");
  EXPECT_THAT(r.out, HasSubstr("v2 SUCCEEDED"));
  // What the destination's replica confirmed (in place: the sync succeeded).
  EXPECT_THAT(r.out, HasSubstr("replicas: (unlabelled) v2"));
  // An older version is refused with the code and the reason.
  r = Ctl("sync", "t 1 --wait");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("FAILED_PRECONDITION"));
}

TEST_F(WsyncctlClusterTest, WatchFollowsASyncToItsEnd) {
  run_->Fill(1);
  Result started = Ctl("sync", "t 1", /*merge=*/false);
  ASSERT_EQ(started.code, 0) << started.out;
  const std::string sync_id(absl::StripAsciiWhitespace(started.out));
  ASSERT_FALSE(sync_id.empty());
  Result r = Ctl("watch", sync_id);
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("100%"));
  EXPECT_THAT(r.out, HasSubstr("workers 2/2"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("sync ", sync_id,
                                            " of transfer 't' version 1 "
                                            "SUCCEEDED")));
  run_->Fill(2);
  r = Ctl("sync", "t 2 --watch");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("version 2 SUCCEEDED"));
  std::string first;
  EXPECT_EQ(run_->Verify(2, &first), 0) << first;
  // On a terminal (util-linux `script` gives it a pty): one line rewritten
  // in place (carriage return, erase to the end of the line).
  run_->Fill(3);
  r = RunShell(absl::StrCat("script -qec '", WSYNCCTL_PATH, " sync t 3 --watch --controller ",
                            run_->cluster->controller_address(), "' /dev/null </dev/null"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\rt v3 ["));
  EXPECT_THAT(r.out, HasSubstr("\033[K"));
  EXPECT_THAT(r.out, HasSubstr("version 3 SUCCEEDED"));
}

TEST_F(WsyncctlClusterTest, CancelEndsARunningSyncAndItsWatcherFails) {
  const pid_t victim = FillAndFreezeDestination(1);
  ASSERT_GT(victim, 0);
  Result started = Ctl("sync", "t 1 --deadline 20s", /*merge=*/false);
  ASSERT_EQ(started.code, 0) << started.out;
  const std::string sync_id(absl::StripAsciiWhitespace(started.out));
  Result watched;
  std::thread watcher([&] { watched = Ctl("watch", sync_id); });
  absl::SleepFor(absl::Milliseconds(500));
  Result status = Ctl("status", "--json", /*merge=*/false);
  v1::GetStatusResponse in_flight;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(status.out, &in_flight).ok())
      << status.out;
  EXPECT_EQ(in_flight.transfers(0).in_flight_version(), 1) << status.out;
  Result r = Ctl("cancel", absl::StrCat(sync_id, " --reason 'operator test'"));
  watcher.join();
  ASSERT_EQ(kill(victim, SIGCONT), 0);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("CANCELLED"));
  EXPECT_EQ(watched.code, 1) << watched.out;
  EXPECT_THAT(watched.out, HasSubstr(absl::StrCat("sync ", sync_id)));
  EXPECT_THAT(watched.out, HasSubstr("CANCELLED"));
  EXPECT_THAT(watched.out, HasSubstr("operator test"));
}

TEST_F(WsyncctlClusterTest, AFailedSyncExitsOneNamingTheGroupRankAndError) {
  const pid_t victim = FillAndFreezeDestination(1);
  ASSERT_GT(victim, 0);
  Result r = Ctl("sync", "t 1 --deadline 1s --watch");
  ASSERT_EQ(kill(victim, SIGCONT), 0);
  std::printf("%s", r.out.c_str());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("version 1 FAILED: group inference rank 0 (worker "));
  EXPECT_THAT(r.out, HasSubstr("did not report"));
  EXPECT_THAT(r.out, HasSubstr("(code 4)"));  // DEADLINE_EXCEEDED
}

TEST_F(WsyncctlClusterTest, ErrorsNameTheCodeAndWhatWasNotFound) {
  ExpectRuns(
      {{"sync", "nosuch 1 --wait", 1, {"NOT_FOUND", "'nosuch'"}},
       {"watch", "no-such-sync", 1, {"NOT_FOUND", "no-such-sync"}},
       {"cancel", "no-such-sync", 1, {"NOT_FOUND"}},
       // Bad usage: 2, naming what was wrong.
       {"sync", "t", 2, {"VERSION is required"}},
       {"sync", "t 1 --wait=soon", 2, {"--wait: expected a duration"}},
       {"workers", "--bogus", 2, {"unknown flag --bogus"}}},
      [&](const std::string& command, const std::string& args) { return Ctl(command, args); });
}

// A controller with --tokens_file: no token is UNAUTHENTICATED, a reader's
// token reads but may not start or cancel a sync (PERMISSION_DENIED).
TEST(WsyncctlAuthTest, TokensWithoutTheTrainerRoleAreRefusedClearly) {
  demo::ClusterOptions options = DefaultClusterOptions();
  const std::string tokens = options.work_dir + "/tokens";
  const std::string reader_file = options.work_dir + "/reader.token";
  std::ofstream(tokens) << "reader-token-0123456789 reader bob\n";
  std::ofstream(reader_file) << "reader-token-0123456789\n";
  options.controller_flags = {"--tokens_file=" + tokens};
  auto cluster = demo::Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // A plaintext controller: a token goes only with an explicit --insecure.
  const std::string at =
      absl::StrCat(" --insecure --controller ", (*cluster)->controller_address());
  Result r = RunCtl(absl::StrCat("status --token reader-token-0123456789 --controller ",
                                 (*cluster)->controller_address()));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("plaintext"));
  const std::string reader = "--token reader-token-0123456789";
  ExpectRuns({{"status", "", 1, {"UNAUTHENTICATED", "--token"}},
              {"status", reader, 0, {"0 workers registered"}},
              {"sync",
               "t 1 --wait --token_file " + reader_file,
               1,
               {"PERMISSION_DENIED", "needs role trainer"}},
              {"cancel", "s-1 --token wrong-token", 1, {"UNAUTHENTICATED", "not in --tokens_file"}},
              {"status", "--token a --token_file " + reader_file, 2, {}}},
             [&](const std::string& command, const std::string& args) {
               return RunCtl(absl::StrCat(command, " ", args, at));
             });
}

}  // namespace
}  // namespace wsync::integration
