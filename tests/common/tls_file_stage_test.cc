// TlsFileStage: a rotation done one file at a time never publishes a key
// that does not match its certificate; sets are published whole, with
// mtimes that change, into a private directory that goes with the stage.
#include "common/tls_file_stage.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_certs.h"

namespace wsync {
namespace {

using integration::TestCerts;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t MtimeSeconds(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_mtim.tv_sec : -1;
}

class TlsFileStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "/tls-stage-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    ASSERT_TRUE(std::filesystem::create_directory(dir_ + "/stage"));
    auto certs = TestCerts::Create(dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = std::make_unique<TestCerts>(*std::move(certs));
    ASSERT_TRUE(certs_->Issue("a", "DNS:localhost").ok());
    ASSERT_TRUE(certs_->Issue("b", "DNS:localhost").ok());
    ASSERT_TRUE(
        certs_->Run("cp a.key live.key && cp a.pem live.pem && cp ca.pem live-ca.pem").ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TlsFileStage::Options Live() const {
    TlsFileStage::Options o;
    o.key = {certs_->Path("live.key"), "--key"};
    o.cert = {certs_->Path("live.pem"), "--cert"};
    o.ca = {certs_->Path("live-ca.pem"), "--controller_ca"};
    o.interval = absl::ZeroDuration();  // Refresh() only: the test decides when
    o.parent_dir = dir_ + "/stage";
    return o;
  }
  // Replaces live.<ext> with <from> atomically, as an operator's `mv` does.
  void Install(const std::string& from, const std::string& to) {
    ASSERT_TRUE(
        certs_->Run(absl::StrCat("cp ", from, " ", to, ".new && mv ", to, ".new ", to)).ok());
  }

  std::string dir_;
  std::unique_ptr<TestCerts> certs_;
};

TEST_F(TlsFileStageTest, PublishesTheSetIntoAPrivateDirectory) {
  auto stage = TlsFileStage::Start(Live());
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_EQ((*stage)->generation(), 1);
  EXPECT_EQ(ReadAll((*stage)->key_path()), certs_->Read("a.key"));
  EXPECT_EQ(ReadAll((*stage)->cert_path()), certs_->Read("a.pem"));
  EXPECT_EQ(ReadAll((*stage)->ca_path()), certs_->Read("ca.pem"));
  struct stat st {};
  ASSERT_EQ(stat((*stage)->directory().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((*stage)->key_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE((*stage)->Refresh().ok());
  EXPECT_EQ((*stage)->generation(), 1) << "unchanged files publish nothing";
}

TEST_F(TlsFileStageTest, AKeyReplacedBeforeItsCertificateKeepsTheOldPairUntilBothAreNew) {
  auto stage = TlsFileStage::Start(Live());
  ASSERT_TRUE(stage.ok()) << stage.status();
  const int64_t first_mtime = MtimeSeconds((*stage)->key_path());
  ASSERT_NO_FATAL_FAILURE(Install("b.key", "live.key"));
  absl::Status half = (*stage)->Refresh();
  EXPECT_EQ(half.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(half.message(), AllOf(HasSubstr("--key '" + certs_->Path("live.key") + "'"),
                                    HasSubstr("does not match"), HasSubstr("--cert")));
  EXPECT_EQ(ReadAll((*stage)->key_path()), certs_->Read("a.key"));
  EXPECT_EQ(ReadAll((*stage)->cert_path()), certs_->Read("a.pem"));
  EXPECT_EQ((*stage)->generation(), 1);

  ASSERT_NO_FATAL_FAILURE(Install("b.pem", "live.pem"));
  ASSERT_TRUE((*stage)->Refresh().ok());
  EXPECT_EQ((*stage)->generation(), 2);
  EXPECT_EQ(ReadAll((*stage)->key_path()), certs_->Read("b.key"));
  EXPECT_EQ(ReadAll((*stage)->cert_path()), certs_->Read("b.pem"));
  // gRPC's watcher compares whole-second mtimes around its read: a new set
  // must never carry the old one's.
  EXPECT_GT(MtimeSeconds((*stage)->key_path()), first_mtime);
  EXPECT_EQ(MtimeSeconds((*stage)->cert_path()), MtimeSeconds((*stage)->key_path()));
}

TEST_F(TlsFileStageTest, AnUnusableSetIsRefusedAtStartNamingTheFile) {
  TlsFileStage::Options mismatched = Live();
  mismatched.key.path = certs_->Path("b.key");
  auto stage = TlsFileStage::Start(mismatched);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(stage.status().message(),
              AllOf(HasSubstr("b.key"), HasSubstr("does not match"), HasSubstr("live.pem")));

  TlsFileStage::Options missing = Live();
  missing.ca.path = certs_->Path("nope.pem");
  stage = TlsFileStage::Start(missing);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(stage.status().message(),
              AllOf(HasSubstr("cannot read --controller_ca"), HasSubstr("nope.pem")));

  TlsFileStage::Options not_pem = Live();
  not_pem.ca.path = certs_->Path("a.key");  // a key, no certificate
  stage = TlsFileStage::Start(not_pem);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(stage.status().message(), HasSubstr("holds no PEM certificate"));

  TlsFileStage::Options half = Live();
  half.cert.path.clear();
  stage = TlsFileStage::Start(half);
  ASSERT_FALSE(stage.ok());
  EXPECT_THAT(stage.status().message(), HasSubstr("go together"));
}

// Hostile input: a "certificate" file far larger than any real one (here
// 5 MiB of PEM-looking lines) is refused naming it, at start and on a
// rotation, and the pair in use stays.
TEST_F(TlsFileStageTest, AnOversizedFileIsRefusedNamingItAndTheOldSetStays) {
  ASSERT_TRUE(certs_
                  ->Run("yes MIIBkTCB+wIJAKHHIG8g1bW5MA0GCSqGSIb3DQEBCwUAMBExDzANBgNVBAMM | "
                        "head -c 5242880 > huge.pem")
                  .ok());
  TlsFileStage::Options huge = Live();
  huge.cert.path = certs_->Path("huge.pem");
  auto refused = TlsFileStage::Start(huge);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(
      refused.status().message(),
      AllOf(HasSubstr("--cert '" + certs_->Path("huge.pem") + "'"), HasSubstr("over 4 MiB")));

  auto stage = TlsFileStage::Start(Live());
  ASSERT_TRUE(stage.ok()) << stage.status();
  ASSERT_NO_FATAL_FAILURE(Install("huge.pem", "live.pem"));
  EXPECT_THAT((*stage)->Refresh().message(), HasSubstr("over 4 MiB"));
  EXPECT_EQ(ReadAll((*stage)->cert_path()), certs_->Read("a.pem"));
  EXPECT_EQ((*stage)->generation(), 1);
}

TEST_F(TlsFileStageTest, ACaAloneIsStagedAndATruncatedOneKeepsTheOldBundle) {
  TlsFileStage::Options o = Live();
  o.key.path.clear();
  o.cert.path.clear();
  auto stage = TlsFileStage::Start(o);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_TRUE((*stage)->key_path().empty());
  EXPECT_EQ(ReadAll((*stage)->ca_path()), certs_->Read("ca.pem"));
  ASSERT_TRUE(certs_->Run("head -c 40 ca.pem > cut.pem").ok());
  ASSERT_NO_FATAL_FAILURE(Install("cut.pem", "live-ca.pem"));
  EXPECT_FALSE((*stage)->Refresh().ok());
  EXPECT_EQ(ReadAll((*stage)->ca_path()), certs_->Read("ca.pem"));
}

// A directory whose lock nobody holds is a killed process's (in this PID
// namespace or another sharing the directory): removed. One whose lock is
// held, or that has no lock file, stays.
TEST_F(TlsFileStageTest, TheDirectoryGoesWithTheStageAndUnlockedOnesAtStart) {
  auto make = [&](const std::string& name, bool lock_file) {
    const std::string d = absl::StrCat(dir_, "/stage/wsync-tls-", name);
    EXPECT_TRUE(std::filesystem::create_directory(d));
    if (lock_file) std::ofstream(d + "/lock") << "";
    return d;
  };
  const std::string stale = make("1-killed", true);
  const std::string held = make("2-alive", true);
  const std::string making = make("3-making", false);
  const int fd = open((held + "/lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  std::string dir;
  {
    auto stage = TlsFileStage::Start(Live());
    ASSERT_TRUE(stage.ok()) << stage.status();
    dir = (*stage)->directory();
    EXPECT_TRUE(std::filesystem::exists(dir + "/lock"));
    // A second stage beside it leaves it alone: its lock is held.
    auto second = TlsFileStage::Start(Live());
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_TRUE(std::filesystem::exists(dir));
  }
  close(fd);
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_FALSE(std::filesystem::exists(stale)) << "nobody holds its lock";
  EXPECT_TRUE(std::filesystem::exists(held)) << "its lock is held";
  EXPECT_TRUE(std::filesystem::exists(making)) << "no lock file yet";
}

TEST_F(TlsFileStageTest, TheThreadPublishesARotationWithinTheInterval) {
  TlsFileStage::Options o = Live();
  o.interval = absl::Milliseconds(50);
  auto stage = TlsFileStage::Start(o);
  ASSERT_TRUE(stage.ok()) << stage.status();
  ASSERT_NO_FATAL_FAILURE(Install("b.key", "live.key"));
  ASSERT_NO_FATAL_FAILURE(Install("b.pem", "live.pem"));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while ((*stage)->generation() < 2 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ((*stage)->generation(), 2);
  EXPECT_EQ(ReadAll((*stage)->key_path()), certs_->Read("b.key"));
}

}  // namespace
}  // namespace wsync
