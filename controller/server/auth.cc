#include "controller/server/auth.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace wsync::controller {

namespace {

// Constant-time equality over the bytes (lengths are not secret): a token is
// not given away a byte at a time.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.empty() || a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::string_view BearerToken(const grpc::ServerContextBase& ctx, bool* present) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  *present = it != md.end();
  if (!*present) return {};
  absl::string_view v(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&v, "Bearer ")) return {};
  return absl::StripAsciiWhitespace(v);
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kTrainer:
      return "trainer";
    case Role::kAdmin:
      return "admin";
    case Role::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kReader, Role::kTrainer, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (expected reader, trainer or admin)"));
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokens(absl::string_view text,
                                                    absl::string_view file) {
  std::vector<TokenEntry> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ":", line_no, ": expected '<token> <role> <name>' (--tokens_file), got ", f.size(),
          " fields"));
    }
    absl::StatusOr<Role> role = ParseRole(f[1]);
    if (!role.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ":", line_no, ": ", role.status().message()));
    }
    if (f[0].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(file, ":", line_no, ": token of '", f[2],
                                                     "' is shorter than 16 characters"));
    }
    out.push_back(TokenEntry{std::string(f[0]), *role, std::string(f[2])});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(AuthOptions options) {
  if (!options.insecure && (options.cert_file.empty() || options.key_file.empty())) {
    return absl::InvalidArgumentError(
        "TLS needs --tls_cert and --tls_key (or --insecure for plaintext on a trusted network)");
  }
  if (options.insecure &&
      !(options.cert_file.empty() && options.key_file.empty() && options.client_ca_file.empty())) {
    return absl::InvalidArgumentError(
        "--insecure is plaintext: drop --tls_cert / --tls_key / --tls_client_ca, or --insecure");
  }
  for (const std::string* f : {&options.cert_file, &options.key_file, &options.client_ca_file}) {
    if (f->empty()) continue;
    if (absl::StatusOr<std::string> text = ReadWholeFile(*f, "TLS file"); !text.ok()) {
      return text.status();
    }
  }
  if (options.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls_reload_interval must be at least 1s");
  }
  if (!options.crl_file.empty() && options.insecure) {
    return absl::InvalidArgumentError("--tls_crl_file needs TLS: drop it, or --insecure");
  }
  std::unique_ptr<Authenticator> a(new Authenticator(std::move(options)));
  if (!a->options_.insecure) {
    TlsFileStage::Options files;
    files.key = {a->options_.key_file, "--tls_key"};
    files.cert = {a->options_.cert_file, "--tls_cert"};
    files.ca = {a->options_.client_ca_file, "--tls_client_ca"};
    files.interval = a->options_.reload_interval;
    absl::StatusOr<std::unique_ptr<TlsFileStage>> stage = TlsFileStage::Start(std::move(files));
    if (!stage.ok()) return stage.status();
    a->tls_files_ = *std::move(stage);
  }
  if (!a->options_.crl_file.empty()) {
    absl::StatusOr<std::unique_ptr<RevocationList>> crl = RevocationList::Create(
        a->options_.crl_file, a->options_.client_ca_file, a->options_.reload_interval);
    if (!crl.ok()) return crl.status();
    a->crl_ = *std::move(crl);
  }
  if (!a->options_.tokens_file.empty()) {
    if (absl::Status st = a->ReloadTokensIfChanged(); !st.ok()) return st;
  }
  return a;
}

std::shared_ptr<grpc::ServerCredentials> Authenticator::ServerCredentials() const {
  if (options_.insecure) return grpc::InsecureServerCredentials();
  // The staged copies change only as whole sets, at most once per interval:
  // looking at them every second costs nothing and adds at most 1 s.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls_files_->key_path(), tls_files_->cert_path(), tls_files_->ca_path(), 1);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (options_.client_ca_file.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    tls.watch_root_certs();
    // Optional (trainers may use a token instead), but verified when sent.
    tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

absl::Status Authenticator::ReloadTokensIfChanged() {
  absl::StatusOr<bool> changed = tokens_file_.Changed();
  if (!changed.ok() || !*changed) return changed.status();
  const std::string& path = tokens_file_.path();
  absl::StatusOr<std::string> text = tokens_file_.Read();
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TokenEntry>> tokens = ParseTokens(*text, path);
  if (!tokens.ok()) return tokens.status();
  spdlog::info("[controller] loaded {} token(s) from {}", tokens->size(), path);
  absl::MutexLock lock(&mu_);
  tokens_ = *std::move(tokens);
  return absl::OkStatus();
}

const TokenEntry* Authenticator::FindTokenLocked(absl::string_view token) const {
  const TokenEntry* found = nullptr;
  for (const TokenEntry& e : tokens_) {
    if (SameSecret(e.token, token)) found = &e;  // no early exit
  }
  return found;
}

Caller Authenticator::Identify(const grpc::ServerContextBase& ctx) {
  Caller c;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (!options_.insecure && auth != nullptr &&
      !auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty()) {
    c.has_certificate = true;
    // URI SANs; older gRPC builds list them only among all SANs.
    std::set<std::string> uris;
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
      uris.emplace(v.data(), v.size());
    }
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
      std::string san(v.data(), v.size());
      if (absl::StartsWith(san, "wsync://")) uris.insert(std::move(san));
    }
    for (const std::string& uri : uris) {
      absl::string_view rest = uri;
      if (absl::ConsumePrefix(&rest, kGroupUriPrefix) && !rest.empty()) {
        c.groups.emplace_back(rest);
      } else if (absl::ConsumePrefix(&rest, kRoleUriPrefix)) {
        if (absl::StatusOr<Role> r = ParseRole(rest); r.ok()) c.role = std::max(c.role, *r);
      }
    }
    c.identity = absl::StrJoin(uris, ",");
    if (c.identity.empty()) {
      auto cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
      c.identity = cn.empty() ? "certificate without URI SAN"
                              : absl::StrCat("CN=", std::string(cn[0].data(), cn[0].size()));
    }
  }
  absl::string_view token = BearerToken(ctx, &c.has_token);
  ApplyToken(token, &c);
  return c;
}

void Authenticator::ApplyToken(absl::string_view token, Caller* c) {
  if (!c->has_token || options_.tokens_file.empty()) return;
  if (absl::Status st = ReloadTokensIfChanged(); !st.ok()) {
    spdlog::error("[controller] tokens file: {} (keeping the tokens loaded before)", st.ToString());
  }
  absl::ReaderMutexLock lock(&mu_);
  if (const TokenEntry* e = FindTokenLocked(token); e != nullptr) {
    c->identity = absl::StrCat("token:", e->name);
    c->role = e->role;
  }
}

absl::Status Authenticator::CheckRevoked(const grpc::ServerContextBase& ctx,
                                         absl::string_view method) const {
  if (crl_ == nullptr) return absl::OkStatus();
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return absl::OkStatus();
  auto leaf = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (leaf.empty()) return absl::OkStatus();  // no client certificate
  auto chain = auth->FindPropertyValues(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME);
  return crl_->Check(
      absl::string_view(leaf[0].data(), leaf[0].size()),
      chain.empty() ? absl::string_view() : absl::string_view(chain[0].data(), chain[0].size()),
      method);
}

LeaseCertificate Authenticator::PresentedCertificate(const grpc::ServerContextBase& ctx) {
  LeaseCertificate cert;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return cert;
  auto leaf = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (leaf.empty()) return cert;
  cert.leaf_pem.assign(leaf[0].data(), leaf[0].size());
  auto chain = auth->FindPropertyValues(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME);
  if (!chain.empty()) cert.chain_pem.assign(chain[0].data(), chain[0].size());
  return cert;
}

absl::Status Authenticator::CheckRevokedCertificate(const CertificateIdentity* cert,
                                                    absl::string_view method) const {
  if (crl_ == nullptr || cert == nullptr) return absl::OkStatus();
  return crl_->CheckIdentity(*cert, method);
}

absl::StatusOr<Caller> Authenticator::RequireRole(const grpc::ServerContextBase& ctx, Role needed,
                                                  absl::string_view method) {
  if (absl::Status st = CheckRevoked(ctx, method); !st.ok()) return st;
  return CheckRole(Identify(ctx), needed, method);
}

absl::StatusOr<Caller> Authenticator::RequireRoleByToken(absl::string_view token, Role needed,
                                                         absl::string_view method) {
  Caller c;
  c.has_token = !token.empty();
  ApplyToken(token, &c);
  return CheckRole(std::move(c), needed, method);
}

absl::StatusOr<Caller> Authenticator::CheckRole(Caller c, Role needed,
                                                absl::string_view method) const {
  if (options_.insecure && options_.tokens_file.empty()) {
    c.role = Role::kAdmin;  // plaintext without tokens: nothing to check
    return c;
  }
  if (c.role == Role::kNone && !c.has_certificate) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": ",
        c.has_token ? "the bearer token is not in --tokens_file"
                    : "no credentials: send 'authorization: Bearer <token>' metadata or a "
                      "client certificate with a wsync://role/<role> URI SAN",
        " (needs role ", RoleName(needed), ")"));
  }
  if (c.role < needed) {
    return absl::PermissionDeniedError(absl::StrCat(method, " needs role ", RoleName(needed),
                                                    "; identity '", c.identity, "' has role ",
                                                    RoleName(c.role)));
  }
  return c;
}

absl::StatusOr<Caller> Authenticator::RequireWorker(const grpc::ServerContextBase& ctx,
                                                    absl::string_view method) {
  if (options_.insecure) return Caller{};
  if (absl::Status st = CheckRevoked(ctx, method); !st.ok()) return st;
  Caller c = Identify(ctx);
  if (!c.has_certificate) {
    return absl::UnauthenticatedError(
        absl::StrCat(method,
                     ": workers need a client certificate (mutual TLS, --cert / --key of "
                     "wsync-worker) with wsync://group/<group> URI SANs"));
  }
  return c;
}

absl::Status Authenticator::CheckGroups(const Caller& caller,
                                        const v1::RegisterWorkerRequest& req) const {
  if (options_.insecure) return absl::OkStatus();
  for (const v1::Membership& m : req.memberships()) {
    if (std::find(caller.groups.begin(), caller.groups.end(), m.group()) == caller.groups.end()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "RegisterWorker: group '", m.group(), "' needs a client certificate with URI SAN ",
          kGroupUriPrefix, m.group(), "; identity seen: '", caller.identity, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::controller
