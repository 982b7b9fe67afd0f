// Authenticator pieces that need no connection: the tokens file, roles, and
// the option checks. Handshakes and metadata are covered by
// tests/integration/tls_test.cc.
#include "controller/server/auth.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::controller {
namespace {

using ::testing::HasSubstr;

TEST(AuthTest, TokensFileLinesNameTokenRoleAndName) {
  auto tokens = ParseTokens(
      "# trainers\n"
      "alice-token-0123456789 trainer alice\n"
      "\n"
      "  bob-token-0123456789\treader bob  # read-only\n"
      "ops-token-0123456789 admin ops\n",
      "tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[0].token, "alice-token-0123456789");
  EXPECT_EQ((*tokens)[0].role, Role::kTrainer);
  EXPECT_EQ((*tokens)[1].name, "bob");
  EXPECT_EQ((*tokens)[1].role, Role::kReader);
  EXPECT_EQ((*tokens)[2].role, Role::kAdmin);
}

TEST(AuthTest, BadTokenLinesAreRefusedNamingTheLine) {
  auto role = ParseTokens("a-token-0123456789 root eve\n", "f");
  EXPECT_EQ(role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(role.status().message(), HasSubstr("f:1"));
  EXPECT_THAT(role.status().message(), HasSubstr("unknown role 'root'"));
  auto fields = ParseTokens("\nonly-two-fields-here trainer\n", "f");
  EXPECT_THAT(fields.status().message(), HasSubstr("f:2"));
  auto short_token = ParseTokens("short trainer eve\n", "f");
  EXPECT_THAT(short_token.status().message(), HasSubstr("shorter than 16"));
}

TEST(AuthTest, RolesAreOrdered) {
  EXPECT_LT(Role::kReader, Role::kTrainer);
  EXPECT_LT(Role::kTrainer, Role::kAdmin);
  for (Role r : {Role::kReader, Role::kTrainer, Role::kAdmin}) {
    EXPECT_EQ(*ParseRole(RoleName(r)), r);
  }
  EXPECT_FALSE(ParseRole("none").ok());
}

TEST(AuthTest, TlsIsTheDefaultAndPlaintextIsExplicit) {
  auto tls_without_files = Authenticator::Create(AuthOptions());
  EXPECT_EQ(tls_without_files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tls_without_files.status().message(), HasSubstr("--insecure"));
  AuthOptions mixed;
  mixed.insecure = true;
  mixed.cert_file = "/nonexistent.pem";
  EXPECT_EQ(Authenticator::Create(mixed).status().code(), absl::StatusCode::kInvalidArgument);
  AuthOptions missing;
  missing.cert_file = "/nonexistent.pem";
  missing.key_file = "/nonexistent.key";
  EXPECT_EQ(Authenticator::Create(missing).status().code(), absl::StatusCode::kNotFound);
  AuthOptions plain;
  plain.insecure = true;
  auto ok = Authenticator::Create(plain);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->insecure());
}

TEST(AuthTest, ABadTokensFileStopsTheStart) {
  const std::string path = ::testing::TempDir() + "/auth_test_tokens";
  std::ofstream(path) << "x trainer\n";
  AuthOptions o;
  o.insecure = true;
  o.tokens_file = path;
  auto a = Authenticator::Create(o);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(path + ":1"));
}

}  // namespace
}  // namespace wsync::controller
