// Certificates rotated in place while syncs run, and revoked or expired ones
// refused (docs/security.md, "Rotation" and "Revocation"): a second CA joins
// both CA bundles, the controller's server certificate and the workers'
// client certificate are replaced by ones of that CA, the old worker
// certificate is revoked through --tls_crl_file, and every sync meanwhile
// succeeds and is verified.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/integration/test_certs.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;

constexpr char kOps[] = "ops-admin-token-0123456789";
constexpr char kWorkerSans[] = "URI:wsync://group/trainer,URI:wsync://group/inference";
constexpr char kServerSans[] = "IP:127.0.0.1,DNS:localhost";

class TlsRotationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = DefaultClusterOptions();
    auto ca1 = TestCerts::Create(options_.work_dir);
    ASSERT_TRUE(ca1.ok()) << ca1.status();
    ca1_ = std::make_unique<TestCerts>(*std::move(ca1));
    ASSERT_TRUE(ca1_->Run("mkdir ca2").ok());
    auto ca2 = TestCerts::Create(ca1_->Path("ca2"));
    ASSERT_TRUE(ca2.ok()) << ca2.status();
    ca2_ = std::make_unique<TestCerts>(*std::move(ca2));
    for (TestCerts* ca : {ca1_.get(), ca2_.get()}) {
      ASSERT_TRUE(ca->Issue("server", kServerSans).ok());
      ASSERT_TRUE(ca->Issue("worker", kWorkerSans).ok());
    }
    ASSERT_TRUE(ca1_->WriteCrl().ok());
    // The files the processes read ("live-*"), all of the first CA.
    ASSERT_TRUE(ca1_->Run(absl::StrCat(
                              "cp server.pem live-server.pem && cp server.key live-server.key && "
                              "cp worker.pem live-worker.pem && cp worker.key live-worker.key && "
                              "cp ca.pem live-client-ca.pem && cp ca.pem live-controller-ca.pem && "
                              "cp crl.pem live-crl.pem && printf '",
                              kOps, " admin ops\\n' > tokens"))
                    .ok());
    options_.insecure = false;
    options_.controller_flags = {"--tls_cert=" + ca1_->Path("live-server.pem"),
                                 "--tls_key=" + ca1_->Path("live-server.key"),
                                 "--tls_client_ca=" + ca1_->Path("live-client-ca.pem"),
                                 "--tls_crl_file=" + ca1_->Path("live-crl.pem"),
                                 "--tokens_file=" + ca1_->Path("tokens"),
                                 "--tls_reload_interval=1s",
                                 "--max_connection_age=2s"};
    options_.worker_flags = {"--controller_ca=" + ca1_->Path("live-controller-ca.pem"),
                             "--cert=" + ca1_->Path("live-worker.pem"),
                             "--key=" + ca1_->Path("live-worker.key"), "--tls_reload_interval=1s"};
    options_.credentials = Tls({ca1_.get(), ca2_.get()});
    options_.token = kOps;
  }

  // TLS trusting the CAs `trusted`, with client certificate <name> of `ca`
  // (none when null).
  static std::shared_ptr<grpc::ChannelCredentials> Tls(std::vector<const TestCerts*> trusted,
                                                       const TestCerts* ca = nullptr,
                                                       const std::string& name = "") {
    grpc::SslCredentialsOptions ssl;
    for (const TestCerts* t : trusted) ssl.pem_root_certs += t->Read("ca.pem");
    if (ca != nullptr) {
      ssl.pem_cert_chain = ca->Read(name + ".pem");
      ssl.pem_private_key = ca->Read(name + ".key");
    }
    return grpc::SslCredentials(ssl);
  }

  // A fresh connection (a channel argument keeps it from sharing one).
  std::shared_ptr<grpc::Channel> Channel(std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetInt("wsync.test.connection", ++connections_);
    return grpc::CreateCustomChannel(run_->cluster->controller_address(), std::move(creds), args);
  }

  // A worker call with certificate <name> of `ca`: OK or the controller's
  // answer about the (made-up) lease when the certificate is accepted.
  grpc::Status WorkerCall(const TestCerts& ca, const std::string& name) {
    auto stub = v1::WorkerService::NewStub(Channel(Tls({ca1_.get(), ca2_.get()}, &ca, name)));
    v1::HeartbeatRequest req;
    req.set_lease_id("00000000000000000000000000000000");
    v1::HeartbeatResponse resp;
    return Call([&](grpc::ClientContext* c) { return stub->Heartbeat(c, req, &resp); },
                absl::Seconds(5));
  }

  // Replaces live-<to> with `from` (a path) atomically.
  void Install(const std::string& from, const std::string& to) {
    ASSERT_TRUE(ca1_->Run(absl::StrCat("cp '", from, "' live-", to, ".new && mv live-", to,
                                       ".new live-", to))
                    .ok());
  }

  // Syncs version after version for `d` (at least one), each one succeeding;
  // the last one verified byte for byte.
  void SyncFor(absl::Duration d) {
    CaseRun& run = *run_;
    const absl::Time until = absl::Now() + d;
    do {
      ++version_;
      run.Fill(version_);
      v1::SyncStatus st;
      grpc::Status s = run.SyncAndWait("t", version_, &st);
      ASSERT_TRUE(s.ok()) << "version " << version_ << ": " << s.error_message();
      ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << "version " << version_ << ": " << st.error();
    } while (absl::Now() < until);
    std::string first;
    EXPECT_EQ(run.Verify(version_, &first), 0) << first;
  }

  demo::ClusterOptions options_;
  std::unique_ptr<TestCerts> ca1_, ca2_;
  std::unique_ptr<CaseRun> run_;  // stops before the certificates go
  int connections_ = 0;
  int64_t version_ = 1;
};

// Polls `fn` (every 200 ms, up to 15 s) until it returns true.
template <typename Fn>
bool Eventually(Fn fn) {
  for (const absl::Time until = absl::Now() + absl::Seconds(15); absl::Now() < until;) {
    if (fn()) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return fn();
}

TEST_F(TlsRotationTest, CertificatesRotateWhileSyncsRunAndTheOldOneIsRevoked) {
  ASSERT_NO_FATAL_FAILURE(StartSyncedOnce(options_, &run_));
  const std::string old_serial = ca1_->Serial("worker");
  ASSERT_FALSE(old_serial.empty());
  EXPECT_EQ(WorkerCall(*ca2_, "worker").error_code(), grpc::StatusCode::UNAVAILABLE)
      << "the second CA is not trusted yet";

  // 1. Both CA bundles trust the second CA too.
  const std::string both = ca1_->Path("both-cas.pem");
  ASSERT_TRUE(ca1_->Run("cat ca.pem ca2/ca.pem > both-cas.pem").ok());
  ASSERT_NO_FATAL_FAILURE(Install(both, "client-ca.pem"));
  ASSERT_NO_FATAL_FAILURE(Install(both, "controller-ca.pem"));
  ASSERT_NO_FATAL_FAILURE(SyncFor(absl::Seconds(3)));
  EXPECT_TRUE(Eventually([&] {
    return WorkerCall(*ca2_, "worker").error_code() != grpc::StatusCode::UNAVAILABLE;
  })) << "the controller reloaded --tls_client_ca";

  // 2. The server's and the workers' certificates of the second CA, each
  // file replaced atomically, the keys first. For more than two reload
  // intervals only the keys are new: every process keeps its old pair (a
  // key that does not match its certificate is never put in use) and the
  // syncs go on over connections made meanwhile (--max_connection_age 2s).
  ASSERT_NO_FATAL_FAILURE(Install(ca2_->Path("server.key"), "server.key"));
  ASSERT_NO_FATAL_FAILURE(Install(ca2_->Path("worker.key"), "worker.key"));
  ASSERT_NO_FATAL_FAILURE(SyncFor(absl::Seconds(3)));
  ASSERT_NO_FATAL_FAILURE(Install(ca2_->Path("server.pem"), "server.pem"));
  ASSERT_NO_FATAL_FAILURE(Install(ca2_->Path("worker.pem"), "worker.pem"));
  ASSERT_NO_FATAL_FAILURE(SyncFor(absl::Seconds(4)));
  // A client trusting only the second CA reaches the controller: it serves
  // the new certificate.
  EXPECT_TRUE(Eventually([&] {
    auto stub = v1::TrainerService::NewStub(Channel(Tls({ca2_.get()})));
    v1::GetStatusResponse resp;
    return Call(
               [&](grpc::ClientContext* c) {
                 c->AddMetadata("authorization", absl::StrCat("Bearer ", kOps));
                 return stub->GetStatus(c, v1::GetStatusRequest(), &resp);
               },
               absl::Seconds(5))
        .ok();
  })) << "the controller reloaded --tls_cert";

  // 3. The old worker certificate is revoked: refused, naming its serial.
  ASSERT_TRUE(ca1_->Revoke("worker").ok());
  ASSERT_NO_FATAL_FAILURE(Install(ca1_->Path("crl.pem"), "crl.pem"));
  grpc::Status revoked;
  EXPECT_TRUE(Eventually([&] {
    revoked = WorkerCall(*ca1_, "worker");
    return revoked.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  })) << revoked.error_message();
  EXPECT_THAT(revoked.error_message(), HasSubstr("serial " + old_serial));
  EXPECT_THAT(revoked.error_message(), HasSubstr("revoked by --tls_crl_file"));
  // A token does not make a revoked certificate good on the trainer API.
  auto as_trainer =
      v1::TrainerService::NewStub(Channel(Tls({ca1_.get(), ca2_.get()}, ca1_.get(), "worker")));
  v1::GetStatusResponse status;
  grpc::Status with_token = Call([&](grpc::ClientContext* c) {
    c->AddMetadata("authorization", absl::StrCat("Bearer ", kOps));
    return as_trainer->GetStatus(c, v1::GetStatusRequest(), &status);
  });
  EXPECT_EQ(with_token.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(with_token.error_message(), HasSubstr(old_serial));

  // The workers present the new certificate: with the old one revoked, their
  // heartbeats would be refused and their leases (2 s) lost, failing syncs.
  ASSERT_NO_FATAL_FAILURE(SyncFor(options_.lease_ttl * 2 + absl::Seconds(1)));
  EXPECT_NE(WorkerCall(*ca2_, "worker").error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // 4. An expired certificate of a trusted CA does not get through the
  // handshake.
  ASSERT_TRUE(ca2_->IssueExpired("expired", kWorkerSans).ok());
  grpc::Status expired = WorkerCall(*ca2_, "expired");
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAVAILABLE) << expired.error_message();
}

}  // namespace
}  // namespace wsync::integration
