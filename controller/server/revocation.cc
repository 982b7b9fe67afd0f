#include "controller/server/revocation.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/openssl_ptr.h"

namespace wsync::controller {
namespace {

// Every PEM certificate of `pem`, in order.
std::vector<X509Ptr> ReadCertificates(absl::string_view pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = MemBio(pem);
  while (bio != nullptr) {
    X509Ptr x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (x == nullptr) break;
    out.push_back(std::move(x));
  }
  ERR_clear_error();  // the end of the input reads as an error
  return out;
}

// "CN=wsync-test-ca,O=..." (RFC 2253).
std::string NameText(const X509_NAME* name) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253) < 0) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// Upper-case hex, as `openssl x509 -serial` prints it.
std::string SerialText(const ASN1_INTEGER* serial) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(serial, nullptr);
  if (bn == nullptr) return "?";
  char* hex = BN_bn2hex(bn);
  std::string out = hex != nullptr ? hex : "?";
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

// Whether a CRL of `issuer` outside the CA bundle revokes `cert`: one that a
// certificate of the chain `certs` named `issuer` verifies (any of them: an
// extra certificate of the same name with another key changes nothing).
bool RevokedByPending(const Revocations& lists, const CertificateIdentity& certs, X509* cert,
                      const std::string& issuer) {
  auto [first, last] = lists.pending.equal_range(issuer);
  for (auto it = first; it != last; ++it) {
    X509_CRL* crl = it->second.get();
    X509_REVOKED* entry = nullptr;
    if (X509_CRL_get0_by_cert(crl, &entry, cert) != 1) continue;
    for (const CertificateIdentity::Cert& signer : certs.certs) {
      if (X509_NAME_cmp(X509_get_subject_name(signer.x509.get()), X509_CRL_get_issuer(crl)) != 0) {
        continue;
      }
      EVP_PKEY* key = X509_get0_pubkey(signer.x509.get());
      if (key != nullptr && X509_CRL_verify(crl, key) == 1) {
        ERR_clear_error();
        return true;
      }
    }
    ERR_clear_error();
  }
  return false;
}

// The serials a CRL lists, as (issuer, serial) pairs into `out`.
void AddRevoked(X509_CRL* crl, const std::string& issuer,
                absl::flat_hash_set<std::pair<std::string, std::string>>* out) {
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl);
  for (int i = 0; i < sk_X509_REVOKED_num(revoked); ++i) {
    const X509_REVOKED* r = sk_X509_REVOKED_value(revoked, i);
    out->emplace(issuer, SerialText(X509_REVOKED_get0_serialNumber(r)));
  }
}

}  // namespace

absl::StatusOr<Revocations> ParseRevocations(absl::string_view crl_pem, absl::string_view ca_pem,
                                             absl::string_view file) {
  const std::vector<X509Ptr> cas = ReadCertificates(ca_pem);
  Revocations out;
  BioPtr bio = MemBio(crl_pem);
  while (bio != nullptr) {
    CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
    if (crl == nullptr) break;
    ++out.lists;
    const X509_NAME* issuer = X509_CRL_get_issuer(crl.get());
    const std::string issuer_text = NameText(issuer);
    bool known = false, verified = false;
    for (const X509Ptr& ca : cas) {
      if (X509_NAME_cmp(X509_get_subject_name(ca.get()), issuer) != 0) continue;
      known = true;
      EVP_PKEY* key = X509_get0_pubkey(ca.get());
      if (key != nullptr && X509_CRL_verify(crl.get(), key) == 1) verified = true;
    }
    ERR_clear_error();
    if (!known) {  // maybe an intermediate's: verified per call (header)
      spdlog::info(
          "[controller] --tls_crl_file {}: CRL #{} is of '{}', no CA of --tls_client_ca; "
          "applied to clients whose chain holds that issuer's certificate",
          std::string(file), out.lists, issuer_text);
      ++out.skipped;
      AddRevoked(crl.get(), issuer_text, &out.pending_revoked);
      out.pending.emplace(issuer_text, std::shared_ptr<X509_CRL>(crl.release(), X509_CRL_free));
      continue;
    }
    if (!verified) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_crl_file '", file, "': CRL #", out.lists, " of issuer '", issuer_text,
                       "' does not verify with that CA's key (--tls_client_ca)"));
    }
    const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get());
    if (next != nullptr && X509_cmp_current_time(next) < 0) {
      spdlog::warn(
          "[controller] --tls_crl_file {}: the CRL of '{}' is past its nextUpdate; "
          "applying it anyway, publish a fresh one",
          std::string(file), issuer_text);
    }
    AddRevoked(crl.get(), issuer_text, &out.revoked);
  }
  ERR_clear_error();
  if (out.lists == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_crl_file '", file, "' holds no PEM CRL ('-----BEGIN X509 CRL-----')"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RevocationList>> RevocationList::Create(
    std::string crl_file, std::string ca_file, absl::Duration reload_interval) {
  if (ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_crl_file needs --tls_client_ca (the CAs whose revocations it lists)");
  }
  auto list = absl::WrapUnique(
      new RevocationList(std::move(crl_file), std::move(ca_file), reload_interval));
  if (absl::Status st = list->ReloadIfChanged(); !st.ok()) return st;
  // Ticks finer than the interval: a look is due reload_interval after the
  // last one (the watchers' gate), whoever looked last.
  RevocationList* self = list.get();
  const absl::Duration tick = std::min(self->reload_interval_, absl::Milliseconds(250));
  list->reloader_ = std::thread([self, tick] {
    while (!self->stop_.WaitForNotificationWithTimeout(tick)) self->ReloadLogged();
  });
  return list;
}

RevocationList::~RevocationList() {
  stop_.Notify();
  if (reloader_.joinable()) reloader_.join();
}

void RevocationList::ReloadLogged() {
  if (absl::Status st = ReloadIfChanged(); !st.ok()) {
    spdlog::error("[controller] {} (keeping the revocation lists loaded before)", st.ToString());
  }
}

absl::Status RevocationList::ReloadIfChanged() {
  // One reload at a time: a slow one must not store its older lists over a
  // newer one's (the watchers already recorded the newer files).
  absl::MutexLock reloading(&reload_mu_);
  // Both looked at every time: each records its own state.
  absl::StatusOr<bool> crl_changed = crl_.Changed();
  absl::StatusOr<bool> ca_changed = ca_.Changed();
  absl::Status st = Reload(crl_changed, ca_changed);
  if (!st.ok()) {  // not taken as seen: the next look tries again
    crl_.Forget();
    ca_.Forget();
  }
  return st;
}

absl::Status RevocationList::Reload(const absl::StatusOr<bool>& crl_changed,
                                    const absl::StatusOr<bool>& ca_changed) {
  if (!crl_changed.ok()) return crl_changed.status();
  if (!ca_changed.ok()) return ca_changed.status();
  if (!*crl_changed && !*ca_changed) return absl::OkStatus();
  absl::StatusOr<std::string> crl = crl_.Read();
  if (!crl.ok()) return crl.status();
  absl::StatusOr<std::string> ca = ca_.Read();
  if (!ca.ok()) return ca.status();
  absl::StatusOr<Revocations> parsed = ParseRevocations(*crl, *ca, crl_.path());
  if (!parsed.ok()) return parsed.status();
  spdlog::info("[controller] --tls_crl_file {}: {} CRL(s), {} revoked certificate(s)", crl_.path(),
               parsed->lists, parsed->revoked.size());
  std::atomic_store(&current_, std::make_shared<const Revocations>(*std::move(parsed)));
  return absl::OkStatus();
}

std::shared_ptr<const CertificateIdentity> IdentifyCertificate(absl::string_view leaf_pem,
                                                               absl::string_view chain_pem) {
  if (leaf_pem.empty()) return nullptr;
  auto out = std::make_shared<CertificateIdentity>();
  std::vector<X509Ptr> certs = ReadCertificates(leaf_pem);
  if (certs.empty()) return out;  // the leaf did not parse
  for (X509Ptr& c : ReadCertificates(chain_pem)) certs.push_back(std::move(c));
  for (X509Ptr& c : certs) {
    CertificateIdentity::Cert id;
    id.issuer = NameText(X509_get_issuer_name(c.get()));
    id.serial = SerialText(X509_get0_serialNumber(c.get()));
    id.subject = NameText(X509_get_subject_name(c.get()));
    id.x509 = std::shared_ptr<X509>(c.release(), X509_free);
    out->certs.push_back(std::move(id));
  }
  return out;
}

absl::Status RevocationList::Check(absl::string_view cert_pem, absl::string_view chain_pem,
                                   absl::string_view method) {
  ReloadLogged();
  std::shared_ptr<const CertificateIdentity> identity = IdentifyCertificate(cert_pem, chain_pem);
  if (identity == nullptr) identity = std::make_shared<const CertificateIdentity>();
  return CheckIdentity(*identity, method);
}

absl::Status RevocationList::CheckIdentity(const CertificateIdentity& identity,
                                           absl::string_view method) const {
  if (identity.certs.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": the client certificate could not be read for the revocation check"));
  }
  const std::shared_ptr<const Revocations> lists = std::atomic_load(&current_);
  for (const CertificateIdentity::Cert& c : identity.certs) {
    const std::pair<std::string, std::string> key(c.issuer, c.serial);
    if (lists->revoked.count(key) == 0 &&
        (lists->pending_revoked.count(key) == 0 ||
         !RevokedByPending(*lists, identity, c.x509.get(), c.issuer))) {
      continue;
    }
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": certificate serial ", c.serial, " (subject '", c.subject, "', issuer '",
        c.issuer, "') is revoked by --tls_crl_file '", crl_.path(), "'"));
  }
  return absl::OkStatus();
}

}  // namespace wsync::controller
