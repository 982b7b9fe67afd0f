// RevocationList (--tls_crl_file) with CAs, certificates and CRLs made by
// openssl: revoked serials refused by name, CRLs verified against the client
// CA bundle, reloads after the file changed.
#include "controller/server/revocation.h"

#include <stdlib.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_certs.h"

namespace wsync::controller {
namespace {

using integration::TestCerts;
using ::testing::HasSubstr;

class RevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-crl-XXXXXX");
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    auto ca = TestCerts::Create(dir);
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = std::make_unique<TestCerts>(*std::move(ca));
    ASSERT_TRUE(ca_->Run("mkdir other").ok());
    auto other = TestCerts::Create(ca_->Path("other"));  // same name, another key
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = std::make_unique<TestCerts>(*std::move(other));
    ASSERT_TRUE(ca_->Issue("alice", "URI:wsync://role/trainer").ok());
    ASSERT_TRUE(ca_->Issue("bob", "URI:wsync://group/inference").ok());
    ASSERT_TRUE(ca_->WriteCrl().ok());
  }

  std::unique_ptr<TestCerts> ca_, other_;
};

TEST_F(RevocationTest, ARevokedCertificateIsRefusedNamingItsSerialAfterTheFileChanged) {
  auto list = RevocationList::Create(ca_->Path("crl.pem"), ca_->Path("ca.pem"), absl::Seconds(1));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE((*list)->Check(ca_->Read("alice.pem"), "", "Sync").ok());

  ASSERT_TRUE(ca_->Revoke("alice").ok());
  absl::SleepFor(absl::Milliseconds(1100));  // the reload interval
  absl::Status refused = (*list)->Check(ca_->Read("alice.pem"), "", "Sync");
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("Sync: certificate serial " + ca_->Serial("alice")));
  EXPECT_THAT(refused.message(), HasSubstr("CN=wsync-test-ca"));
  EXPECT_TRUE((*list)->Check(ca_->Read("bob.pem"), "", "Heartbeat").ok()) << "bob is not revoked";
  // In the chain counts as well.
  EXPECT_FALSE((*list)->Check(ca_->Read("bob.pem"), ca_->Read("alice.pem"), "Heartbeat").ok());

  // A file that stops parsing keeps the lists loaded before.
  ASSERT_TRUE(ca_->Run("echo garbage > crl.pem").ok());
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_FALSE((*list)->Check(ca_->Read("alice.pem"), "", "Sync").ok());
}

// The control fast lane's check (CheckIdentity: a certificate parsed once, at
// a worker's registration): no call looks at the file, the list's own thread
// loads the change, and the next check refuses naming the serial.
TEST_F(RevocationTest, ACheckOfAParsedIdentitySeesWhatTheReloaderLoaded) {
  auto list = RevocationList::Create(ca_->Path("crl.pem"), ca_->Path("ca.pem"), absl::Seconds(1));
  ASSERT_TRUE(list.ok()) << list.status();
  std::shared_ptr<const CertificateIdentity> alice =
      IdentifyCertificate(ca_->Read("alice.pem"), "");
  ASSERT_NE(alice, nullptr);
  ASSERT_EQ(alice->certs.size(), 1u);
  EXPECT_EQ(alice->certs[0].serial, ca_->Serial("alice"));
  EXPECT_TRUE((*list)->CheckIdentity(*alice, "lane: ReportResult").ok());

  ASSERT_TRUE(ca_->Revoke("alice").ok());
  // The interval and a tick of the reloader, polled (a loaded machine may
  // run the reloader late).
  absl::Status refused;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
    refused = (*list)->CheckIdentity(*alice, "lane: ReportResult");
    if (!refused.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("lane: ReportResult: certificate serial " + ca_->Serial("alice")));
  EXPECT_TRUE((*list)->CheckIdentity(*IdentifyCertificate(ca_->Read("bob.pem"), ""), "x").ok());
  // No certificate: nothing to check; one that does not parse: refused.
  EXPECT_EQ(IdentifyCertificate("", ""), nullptr);
  EXPECT_EQ((*list)->CheckIdentity(*IdentifyCertificate("garbage", ""), "x").code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(RevocationTest, CrlsAreCheckedAgainstTheClientCaBundle) {
  const std::string crl = ca_->Read("crl.pem");
  // Signed by a CA of the same name with another key: refused.
  auto forged = ParseRevocations(crl, other_->Read("ca.pem"), "crl.pem");
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(forged.status().message(), HasSubstr("does not verify"));
  // Of a CA outside the bundle: kept aside, verified per call against the
  // presented chain (RevocationTest.AnIntermediatesCrlAppliesToChainsThatHoldIt).
  ASSERT_TRUE(ca_->Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                       "-nodes -keyout stranger.key -out stranger.pem -days 2 -subj /CN=stranger")
                  .ok());
  auto skipped = ParseRevocations(crl, ca_->Read("stranger.pem"), "crl.pem");
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->skipped, 1);
  // Both CAs in the bundle: the one that signed it verifies it.
  auto both = ParseRevocations(crl, other_->Read("ca.pem") + ca_->Read("ca.pem"), "crl.pem");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->lists, 1);
  EXPECT_EQ(both->skipped, 0);

  auto none = ParseRevocations("not a CRL", ca_->Read("ca.pem"), "crl.pem");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("holds no PEM CRL"));
  EXPECT_EQ(RevocationList::Create(ca_->Path("crl.pem"), "", absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "needs --tls_client_ca";
  EXPECT_EQ(RevocationList::Create(ca_->Path("missing.pem"), ca_->Path("ca.pem"), absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RevocationTest, AnIntermediatesCrlAppliesToChainsThatHoldIt) {
  // ca_ plays an intermediate CA that is not in the bundle (clients send its
  // certificate in their chain); the bundle holds only another root.
  ASSERT_TRUE(ca_->Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                       "-nodes -keyout root.key -out root.pem -days 2 -subj /CN=root")
                  .ok());
  ASSERT_TRUE(ca_->Revoke("alice").ok());
  auto list = RevocationList::Create(ca_->Path("crl.pem"), ca_->Path("root.pem"), absl::Seconds(1));
  ASSERT_TRUE(list.ok()) << list.status();
  const std::string alice = ca_->Read("alice.pem");
  absl::Status refused = (*list)->Check(alice, ca_->Read("ca.pem"), "Sync");
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(ca_->Serial("alice")));
  // A certificate of the same name with another key verifies nothing; beside
  // the real one it changes nothing.
  EXPECT_TRUE((*list)->Check(alice, other_->Read("ca.pem"), "Sync").ok());
  EXPECT_FALSE((*list)->Check(alice, other_->Read("ca.pem") + ca_->Read("ca.pem"), "Sync").ok());
  EXPECT_TRUE((*list)->Check(ca_->Read("bob.pem"), ca_->Read("ca.pem"), "Sync").ok());
}

TEST_F(RevocationTest, TheCaBundleIsWatched) {
  ASSERT_TRUE(ca_->Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                       "-nodes -keyout root.key -out root.pem -days 2 -subj /CN=root && "
                       "cp root.pem bundle.pem")
                  .ok());
  ASSERT_TRUE(ca_->Revoke("alice").ok());
  auto list =
      RevocationList::Create(ca_->Path("crl.pem"), ca_->Path("bundle.pem"), absl::Seconds(1));
  ASSERT_TRUE(list.ok()) << list.status();
  const std::string alice = ca_->Read("alice.pem");
  EXPECT_TRUE((*list)->Check(alice, "", "Sync").ok()) << "no verifier for its CRL yet";
  // The CA joins the bundle; the CRL file does not change.
  ASSERT_TRUE(ca_->Run("cat ca.pem >> bundle.pem").ok());
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_EQ((*list)->Check(alice, "", "Sync").code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace wsync::controller
