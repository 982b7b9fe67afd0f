// The control fast lane's admission of workers, call by call as gRPC's
// (controller/server/lane_calls.cc CheckLease): a lease whose registration
// certificate the CRL revokes, or a lease that died, loses the lane on its
// next call; a Hello never rebinds a connection that streams assignments.
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "tests/controller/server/lane_server_fixture.h"
#include "tests/integration/test_certs.h"

namespace wsync::controller {
namespace {

using integration::TestCerts;
using lane_testing::LaneServerTest;
using ::testing::HasSubstr;

class LaneAdmissionTest : public LaneServerTest {
 protected:
  // TLS with client CAs and a CRL (reloaded each second); "bob" holds a
  // worker certificate of group "src".
  AuthOptions Tls() {
    auto ca = TestCerts::Create(dir_);
    EXPECT_TRUE(ca.ok()) << ca.status();
    ca_ = std::make_unique<TestCerts>(*std::move(ca));
    EXPECT_TRUE(ca_->Issue("controller", "DNS:localhost").ok());
    EXPECT_TRUE(ca_->Issue("bob", "URI:wsync://group/src").ok());
    EXPECT_TRUE(ca_->Issue("carol", "URI:wsync://group/src").ok());
    EXPECT_TRUE(ca_->WriteCrl().ok());
    AuthOptions a;
    a.cert_file = ca_->Path("controller.pem");
    a.key_file = ca_->Path("controller.key");
    a.client_ca_file = ca_->Path("ca.pem");
    a.crl_file = ca_->Path("crl.pem");
    a.reload_interval = absl::Seconds(1);
    return a;
  }
  // A lease of rank `rank` registered with `name`'s certificate, as the
  // gRPC service registers it.
  std::string RegisterAs(const std::string& name, int rank) {
    LeaseCertificate cert{ca_->Read(name + ".pem"), ""};
    auto resp = controller_->RegisterWorker(Registration(name, "src", rank, 2, 16),
                                            "wsync://group/src", "", cert);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->lease_id() : "";
  }
  void TearDown() override {
    lane_.reset();
    std::filesystem::remove_all(dir_);  // the CA's files
    LaneServerTest::TearDown();
  }

  std::unique_ptr<TestCerts> ca_;
};

TEST_F(LaneAdmissionTest, ARevokedCertificatesLeaseLosesTheLaneOnItsNextCall) {
  StartLane(Tls());
  const std::string bob = RegisterAs("bob", 0);
  const std::string carol = RegisterAs("carol", 1);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(Call(*c, Hello(bob)).code(), 0);
  v1::LaneResponse r = Call(*c, Report(bob, "no-such-sync"));
  EXPECT_NE(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated)) << r.message();

  ASSERT_TRUE(ca_->Revoke("bob").ok());
  // The CRL's reload interval and a tick of its reloader (no call of the
  // lane looks at the file).
  absl::SleepFor(absl::Milliseconds(1500));
  // The bound connection's next report is refused as gRPC refuses the
  // revoked certificate's calls, naming its serial; the binding is gone.
  r = Call(*c, Report(bob, "no-such-sync"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("lane: ReportResult"));
  EXPECT_THAT(r.message(), HasSubstr("certificate serial " + ca_->Serial("bob")));
  r = Call(*c, Report(bob, "no-such-sync"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("send LaneHello first"));
  r = Call(*c, Hello(bob));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated)) << r.message();
  v1::LaneRequest open;
  open.mutable_assignments()->set_lease_id(bob);
  auto stream = Connect();
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(Call(*stream, open).code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  // Another certificate's lease keeps its lane.
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(Call(*other, Hello(carol)).code(), 0);
}

TEST_F(LaneAdmissionTest, ALeaseThatDiedLosesItsBoundConnection) {
  ThreeWorkers();
  StartLane();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(Call(*c, Hello(leases_[0])).code(), 0);
  controller_->workers().CloseStream(leases_[0], tokens_[leases_[0]], "test: the worker left");
  ASSERT_FALSE(controller_->workers().IsAlive(leases_[0]));
  v1::LaneResponse r = Call(*c, Report(leases_[0], "no-such-sync"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnauthenticated)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("not a live lease"));
  EXPECT_THAT(r.message(), ::testing::Not(HasSubstr(leases_[0]))) << "never echo a secret";
}

TEST_F(LaneAdmissionTest, AHelloOnAStreamingConnectionIsRefusedAndRebindsNothing) {
  leases_ = {Register("a", "src", 0, 2, 16), Register("b", "src", 1, 2, 16)};
  StartLane();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  v1::LaneRequest open;
  open.mutable_assignments()->set_lease_id(leases_[0]);
  ASSERT_EQ(Call(*c, open).code(), 0);
  v1::LaneResponse r = Call(*c, Hello(leases_[1]));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("carries an assignment stream"));
  // Still bound to the stream's lease: a report for the other is refused.
  r = Call(*c, Report(leases_[1], "no-such-sync"));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kPermissionDenied)) << r.message();
  // A report connection may move to a new lease (a worker that registered
  // again), as before.
  auto reporter = Connect();
  ASSERT_NE(reporter, nullptr);
  ASSERT_EQ(Call(*reporter, Hello(leases_[0])).code(), 0);
  EXPECT_EQ(Call(*reporter, Hello(leases_[1])).code(), 0);
}

}  // namespace
}  // namespace wsync::controller
