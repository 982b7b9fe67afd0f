// The control fast lane under --tls_crl_file, with the real binaries: the
// lane admits a worker's calls by its lease and the certificate the lease
// registered with (a Unix socket presents none), checked against the CRL as
// last loaded. A worker that rotated its certificate and then had the old
// one revoked gets its next lane report refused naming the old serial, and
// reports over gRPC instead, where the certificate it presents now is good:
// the sync succeeds, every byte checked.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/integration/test_certs.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kOps[] = "ops-admin-token-0123456789";
constexpr char kWorkerSans[] = "URI:wsync://group/trainer,URI:wsync://group/inference";

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Sync `version` over the lane with its wait; the answer.
v1::LaneResponse LaneSync(const std::string& lane, int64_t version) {
  auto c = LaneClient::Connect(lane);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return v1::LaneResponse();
  v1::LaneRequest r;
  r.set_token(kOps);
  r.mutable_sync()->set_transfer("t");
  r.mutable_sync()->set_version(version);
  r.mutable_sync()->set_wait_ms(20'000);
  auto resp = (*c)->Call(r, absl::Now() + absl::Seconds(40));
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? *resp : v1::LaneResponse();
}

TEST(LaneRevocation, ARevokedRegistrationCertificateMovesTheReportsToGrpc) {
  demo::ClusterOptions o = DefaultClusterOptions();
  auto ca_or = TestCerts::Create(o.work_dir);
  ASSERT_TRUE(ca_or.ok()) << ca_or.status();
  TestCerts& ca = *ca_or;
  ASSERT_TRUE(ca.Issue("server", "IP:127.0.0.1,DNS:localhost").ok());
  ASSERT_TRUE(ca.Issue("worker", kWorkerSans).ok());
  ASSERT_TRUE(ca.Issue("worker2", kWorkerSans).ok());  // the rotated one
  ASSERT_TRUE(ca.WriteCrl().ok());
  ASSERT_TRUE(ca.Run(absl::StrCat("cp worker.pem live-worker.pem && cp worker.key live-worker.key "
                                  "&& cp crl.pem live-crl.pem && printf '",
                                  kOps, " admin ops\\n' > tokens"))
                  .ok());
  const std::string lane = o.work_dir + "/lane.sock";
  o.insecure = false;
  o.controller_flags = {"--tls_cert=" + ca.Path("server.pem"),
                        "--tls_key=" + ca.Path("server.key"),
                        "--tls_client_ca=" + ca.Path("ca.pem"),
                        "--tls_crl_file=" + ca.Path("live-crl.pem"),
                        "--tokens_file=" + ca.Path("tokens"),
                        "--tls_reload_interval=1s",
                        "--max_connection_age=1s",
                        "--lane_socket=" + lane};
  o.worker_flags = {"--controller_ca=" + ca.Path("ca.pem"), "--cert=" + ca.Path("live-worker.pem"),
                    "--key=" + ca.Path("live-worker.key"), "--tls_reload_interval=1s",
                    "--controller_lane=" + lane};
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca.Read("ca.pem");
  o.credentials = grpc::SslCredentials(ssl);
  o.token = kOps;
  const std::string old_serial = ca.Serial("worker");
  ASSERT_FALSE(old_serial.empty());

  std::unique_ptr<CaseRun> run;
  ASSERT_NO_FATAL_FAILURE(StartSyncedOnce(o, &run));
  run->Fill(2);
  v1::LaneResponse resp = LaneSync(lane, 2);
  ASSERT_EQ(resp.code(), 0) << resp.message();
  ASSERT_EQ(resp.sync().status().phase(), v1::SYNC_SUCCEEDED) << resp.sync().status().error();

  // The workers present the second certificate from now on (their gRPC
  // connections are renewed each second); their leases keep the first one.
  ASSERT_TRUE(ca.Run("cp worker2.key live-worker.key.new && mv live-worker.key.new "
                     "live-worker.key && cp worker2.pem live-worker.pem.new && mv "
                     "live-worker.pem.new live-worker.pem")
                  .ok());
  absl::SleepFor(absl::Seconds(4));
  ASSERT_TRUE(ca.Revoke("worker").ok());
  ASSERT_TRUE(ca.Run("cp crl.pem live-crl.pem.new && mv live-crl.pem.new live-crl.pem").ok());
  absl::SleepFor(absl::Seconds(2));  // the CRL's reload interval and a tick

  // The lane refuses their reports naming the old serial; gRPC takes them.
  run->Fill(3);
  resp = LaneSync(lane, 3);
  ASSERT_EQ(resp.code(), 0) << resp.message();
  EXPECT_EQ(resp.sync().status().phase(), v1::SYNC_SUCCEEDED) << resp.sync().status().error();
  std::string first;
  EXPECT_EQ(run->Verify(3, &first), 0) << first;
  for (int i = 0; i < run->cluster->num_workers(); ++i) {
    const std::string log =
        Slurp(absl::StrCat(o.work_dir, "/", run->cluster->worker(i).name, ".log"));
    EXPECT_THAT(log, HasSubstr("lane: ReportResult: certificate serial " + old_serial)) << log;
    EXPECT_THAT(log, HasSubstr("reporting over gRPC")) << log;
    EXPECT_THAT(log, Not(HasSubstr("not delivered"))) << log;
  }
  run.reset();  // the processes stop before the certificates go
}

}  // namespace
}  // namespace wsync::integration
