// The controller over real TLS (certificates made by openssl in the test):
// workers with mutual TLS whose URI SANs name their groups, trainers with
// bearer tokens (or a client certificate's role), the errors of missing and
// insufficient credentials, and a certificate rotated without a restart.
#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/integration/test_certs.h"

namespace wsync::integration {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "alice-trainer-token-0123456789";  // trainer
constexpr char kCarol[] = "carol-trainer-token-0123456789";  // trainer
constexpr char kBob[] = "bob-reader-token-0123456789";       // reader
constexpr char kOps[] = "ops-admin-token-0123456789";        // admin

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = DefaultClusterOptions();
    auto certs = TestCerts::Create(options_.work_dir);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = std::make_unique<TestCerts>(*std::move(certs));
    ASSERT_TRUE(certs_->Issue("server", "IP:127.0.0.1,DNS:localhost").ok());
    ASSERT_TRUE(
        certs_->Issue("worker", "URI:wsync://group/trainer,URI:wsync://group/inference").ok());
    ASSERT_TRUE(certs_->Issue("rogue", "URI:wsync://group/made-up").ok());
    ASSERT_TRUE(certs_->Issue("reader", "URI:wsync://role/reader").ok());
    ASSERT_TRUE(certs_
                    ->Run(absl::StrCat("printf '", kAlice, " trainer alice\\n", kCarol,
                                       " trainer carol\\n# ops\\n", kBob, " reader bob\\n", kOps,
                                       " admin ops\\n' > tokens"))
                    .ok());
    options_.insecure = false;
    options_.controller_flags = {
        "--tls_cert=" + certs_->Path("server.pem"), "--tls_key=" + certs_->Path("server.key"),
        "--tls_client_ca=" + certs_->Path("ca.pem"), "--tokens_file=" + certs_->Path("tokens"),
        "--tls_reload_interval=1s"};
    options_.worker_flags = {"--controller_ca=" + certs_->Path("ca.pem"),
                             "--cert=" + certs_->Path("worker.pem"),
                             "--key=" + certs_->Path("worker.key")};
    options_.credentials = Tls("");
    options_.token = kAlice;
  }

  // TLS trusting the test CA, with client certificate `name` unless empty.
  std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& name) const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = certs_->Read("ca.pem");
    if (!name.empty()) {
      ssl.pem_cert_chain = certs_->Read(name + ".pem");
      ssl.pem_private_key = certs_->Read(name + ".key");
    }
    return grpc::SslCredentials(ssl);
  }

  // A fresh connection (a channel argument keeps it from sharing one).
  std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                         std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetInt("wsync.test.connection", ++connections_);
    return grpc::CreateCustomChannel(address, std::move(creds), args);
  }

  // Calls `fn` on a trainer stub of `channel` sending `token` (none if empty).
  template <typename Fn>
  grpc::Status AsTrainer(std::shared_ptr<grpc::Channel> channel, const std::string& token, Fn fn) {
    auto stub = v1::TrainerService::NewStub(channel);
    return Call([&](grpc::ClientContext* c) {
      if (!token.empty()) c->AddMetadata("authorization", absl::StrCat("Bearer ", token));
      return fn(*stub, c);
    });
  }

  grpc::Status GetStatus(std::shared_ptr<grpc::Channel> channel, const std::string& token) {
    v1::GetStatusResponse resp;
    return AsTrainer(channel, token, [&](v1::TrainerService::Stub& s, grpc::ClientContext* c) {
      return s.GetStatus(c, v1::GetStatusRequest(), &resp);
    });
  }

  demo::ClusterOptions options_;
  std::unique_ptr<TestCerts> certs_;
  std::unique_ptr<CaseRun> run_;  // stops before certs_ goes
  int connections_ = 0;
};

TEST_F(TlsTest, SyncOverMutualTlsWithTokenRoles) {
  ASSERT_NO_FATAL_FAILURE(StartSyncedOnce(options_, &run_));
  CaseRun& run = *run_;
  v1::SyncStatus st;
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;

  const std::string address = run.cluster->controller_address();
  auto tls = Channel(address, Tls(""));
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(AsTrainer(tls, kBob, [&](v1::TrainerService::Stub& s, grpc::ClientContext* c) {
                return s.ListWorkers(c, v1::ListWorkersRequest(), &workers);
              }).ok());
  ASSERT_EQ(workers.workers_size(), 4);
  for (const auto& w : workers.workers()) {
    EXPECT_TRUE(w.lease_id().empty()) << "never listed";
    EXPECT_EQ(w.identity(), "wsync://group/inference,wsync://group/trainer");
  }

  // Missing or unknown credentials: UNAUTHENTICATED, saying what is missing.
  grpc::Status none = GetStatus(tls, "");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(), HasSubstr("no credentials"));
  grpc::Status unknown = GetStatus(tls, "not-a-known-token-at-all");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(unknown.error_message(), HasSubstr("not in --tokens_file"));
  // A reader reads, and nothing more.
  EXPECT_TRUE(GetStatus(tls, kBob).ok());
  v1::SyncRequest sync;
  sync.set_transfer("t");
  sync.set_version(2);
  v1::SyncResponse started;
  grpc::Status by_reader =
      AsTrainer(tls, kBob, [&](v1::TrainerService::Stub& s, grpc::ClientContext* c) {
        return s.Sync(c, sync, &started);
      });
  EXPECT_EQ(by_reader.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(by_reader.error_message(), HasSubstr("needs role trainer"));
  EXPECT_THAT(by_reader.error_message(), HasSubstr("token:bob"));
  // The transfer is alice's (she defined it): another trainer may not sync
  // it (any trainer could before transfers had owners).
  grpc::Status by_carol =
      AsTrainer(tls, kCarol, [&](v1::TrainerService::Stub& s, grpc::ClientContext* c) {
        return s.Sync(c, sync, &started);
      });
  EXPECT_EQ(by_carol.error_code(), grpc::StatusCode::PERMISSION_DENIED) << by_carol.error_message();
  EXPECT_THAT(by_carol.error_message(), HasSubstr("owned by 'token:alice'"));
  EXPECT_THAT(by_carol.error_message(), HasSubstr("'token:carol'"));
  // A client certificate's role works like a token's.
  EXPECT_TRUE(GetStatus(Channel(address, Tls("reader")), "").ok());
  // Plaintext does not reach a TLS controller.
  grpc::Status plain = GetStatus(Channel(address, grpc::InsecureChannelCredentials()), kOps);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();

  // Cancel: not by a reader, nor by another trainer; by the admin.
  run.Fill(2);
  const pid_t frozen = run.cluster->worker(run.dst_worker[1]).child.pid();
  ASSERT_TRUE(Freeze(frozen)) << "pid " << frozen;
  ASSERT_TRUE(AsTrainer(tls, kAlice, [&](v1::TrainerService::Stub& s, grpc::ClientContext* c) {
                return s.Sync(c, sync, &started);
              }).ok());
  v1::CancelRequest cancel;
  cancel.set_sync_id(started.sync_id());
  v1::SyncStatus cancelled;
  auto cancel_as = [&](const char* token) {
    return AsTrainer(tls, token, [&](v1::TrainerService::Stub& s, grpc::ClientContext* c) {
      return s.Cancel(c, cancel, &cancelled);
    });
  };
  grpc::Status reader_cancel = cancel_as(kBob);
  grpc::Status carol_cancel = cancel_as(kCarol);
  grpc::Status admin_cancel = cancel_as(kOps);
  ASSERT_EQ(kill(frozen, SIGCONT), 0);
  EXPECT_EQ(reader_cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(carol_cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(carol_cancel.error_message(), HasSubstr("token:alice"));
  ASSERT_TRUE(admin_cancel.ok()) << admin_cancel.error_message();
  EXPECT_EQ(cancelled.phase(), v1::SYNC_CANCELLED);
  run.Fill(3);
  sync.set_version(3);
  ASSERT_TRUE(run.SyncAndWait("t", 3, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  EXPECT_EQ(run.Verify(3, &first), 0) << first;
}

TEST_F(TlsTest, WorkersRegisterOnlyTheGroupsTheirCertificateNames) {
  ASSERT_NO_FATAL_FAILURE(StartSyncedOnce(options_, &run_));
  CaseRun& run = *run_;
  v1::SyncStatus st;
  const std::string address = run.cluster->controller_address();

  auto register_as = [&](std::shared_ptr<grpc::ChannelCredentials> creds, const std::string& group,
                         v1::RegisterWorkerResponse* resp) {
    auto stub = v1::WorkerService::NewStub(Channel(address, std::move(creds)));
    v1::RegisterWorkerRequest req;
    req.set_instance_id("rogue-" + group);
    auto* m = req.add_memberships();
    m->set_group(group);
    m->set_rank(0);
    m->set_group_size(group == "inference" ? 2 : 1);
    return Call([&](grpc::ClientContext* c) { return stub->RegisterWorker(c, req, resp); });
  };
  v1::RegisterWorkerResponse resp;
  grpc::Status no_cert = register_as(Tls(""), "made-up", &resp);
  EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAUTHENTICATED) << no_cert.error_message();
  EXPECT_THAT(no_cert.error_message(), HasSubstr("client certificate"));
  grpc::Status other_group = register_as(Tls("rogue"), "inference", &resp);
  EXPECT_EQ(other_group.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_group.error_message(), HasSubstr("wsync://group/inference"));
  EXPECT_THAT(other_group.error_message(), HasSubstr("'wsync://group/made-up'"));
  // A certificate of another CA does not even connect.
  ASSERT_TRUE(certs_
                  ->Run("mkdir -p evil && cd evil && openssl req -x509 -newkey ec -pkeyopt "
                        "ec_paramgen_curve:prime256v1 -nodes -keyout ../evil.key -out "
                        "../evil.pem -days 2 -subj /CN=evil -addext "
                        "subjectAltName=URI:wsync://group/inference")
                  .ok());
  grpc::Status foreign = register_as(Tls("evil"), "inference", &resp);
  EXPECT_NE(foreign.error_code(), grpc::StatusCode::OK);
  EXPECT_NE(foreign.error_code(), grpc::StatusCode::ALREADY_EXISTS) << "never reached the registry";

  // Its own group it may join, but not the live transfer's rendezvous.
  ASSERT_TRUE(register_as(Tls("rogue"), "made-up", &resp).ok());
  v1::GetStatusResponse status;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, v1::GetStatusRequest(), &status);
              }).ok());
  auto rogue = v1::WorkerService::NewStub(Channel(address, Tls("rogue")));
  v1::KvSetRequest set;
  set.set_lease_id(resp.lease_id());
  set.set_key(absl::StrCat("t/", status.transfers(0).generation(), "/rank0"));
  set.set_value("attacker");
  v1::KvSetResponse ignored;
  grpc::Status kv = Call([&](grpc::ClientContext* c) { return rogue->KvSet(c, set, &ignored); });
  EXPECT_EQ(kv.error_code(), grpc::StatusCode::PERMISSION_DENIED) << kv.error_message();
  // Its lease is bound to its certificate: a worker of another identity
  // cannot use it.
  auto legit = v1::WorkerService::NewStub(Channel(address, Tls("worker")));
  v1::HeartbeatRequest hb;
  hb.set_lease_id(resp.lease_id());
  v1::HeartbeatResponse hb_resp;
  grpc::Status borrowed =
      Call([&](grpc::ClientContext* c) { return legit->Heartbeat(c, hb, &hb_resp); });
  EXPECT_EQ(borrowed.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(borrowed.error_message(), HasSubstr("wsync://group/made-up"));

  run.Fill(2);
  ASSERT_TRUE(run.SyncAndWait("t", 2, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
}

// The peer's certificate common name as seen by a client.
std::string ServerName(const grpc::ClientContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return "";
  auto cn = auth->FindPropertyValues("x509_common_name");
  return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
}

TEST_F(TlsTest, ARotatedServerCertificateAndNewTokensAreUsedWithoutARestart) {
  auto cluster = demo::Cluster::Start(options_);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->controller_address();
  auto served_name = [&]() {
    auto stub = v1::TrainerService::NewStub(Channel(address, Tls("")));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kBob));
    v1::GetStatusResponse resp;
    grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp);
    return s.ok() ? ServerName(ctx) : s.error_message();
  };
  EXPECT_EQ(served_name(), "server");
  ASSERT_TRUE(certs_->Issue("server2", "IP:127.0.0.1,DNS:localhost").ok());
  // Key first, then the chain, each replaced atomically.
  ASSERT_TRUE(certs_
                  ->Run("cp server2.key server.key.new && mv server.key.new server.key && "
                        "cp server2.pem server.pem.new && mv server.pem.new server.pem")
                  .ok());
  const pid_t controller_pid = (*cluster)->controller_pid();
  std::string name;
  const absl::Time until = absl::Now() + absl::Seconds(15);
  while (absl::Now() < until && (name = served_name()) != "server2") {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(name, "server2") << "--tls_reload_interval=1s";

  // A token added to --tokens_file works once the file is re-read; one
  // removed stops working.
  constexpr char kDave[] = "dave-reader-token-0123456789";
  auto tls = [&] { return Channel(address, Tls("")); };
  EXPECT_EQ(GetStatus(tls(), kDave).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(certs_
                  ->Run(absl::StrCat("printf '", kDave, " reader dave\n", kOps,
                                     " admin ops\n' > tokens.new && mv tokens.new tokens"))
                  .ok());
  bool dave = false;
  for (const absl::Time t = absl::Now() + absl::Seconds(10); absl::Now() < t && !dave;) {
    dave = GetStatus(tls(), kDave).ok();
    if (!dave) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(dave) << "a new token is honoured after the file changed";
  EXPECT_EQ(GetStatus(tls(), kBob).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ((*cluster)->controller_pid(), controller_pid) << "not restarted";
}

}  // namespace
}  // namespace wsync::integration
