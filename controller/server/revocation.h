// RevocationList: the certificate revocation lists of --tls_crl_file, checked
// against every client certificate the controller sees (docs/security.md,
// "Revocation").
//
// Why not gRPC's own: Debian 12's gRPC (1.51) offers only
// TlsServerCredentialsOptions::set_crl_directory (no CrlProvider): OpenSSL
// then refuses a revoked certificate inside the handshake, so the caller sees
// a bare UNAVAILABLE "handshake failed", the controller logs nothing that
// names the certificate, and the directory must hold c_rehash-named files.
// Here the handshake completes and every call of a revoked certificate is
// answered UNAUTHENTICATED naming its serial and issuer.
//
// The file holds one or more PEM CRLs ("-----BEGIN X509 CRL-----"). A CRL
// whose issuer is a CA of --tls_client_ca must verify with that CA's key (a
// file that fails to is refused). One of another issuer may be an
// intermediate CA's, whose certificate clients send in their chain: it is
// kept aside and applied to a call whose presented chain holds a certificate
// of that issuer whose key verifies the CRL (a CA that left the bundle
// revokes nothing then: its clients fail the handshake). A CRL past its
// nextUpdate is still applied (a stale list revokes no less) and logged when
// loaded.
//
// Reloading: the CRL file and the CA bundle are looked at (stat) at most once
// per reload interval and both re-read when either's size or mtime changed; a
// load that fails (the file no longer parses or verifies) keeps the lists
// loaded before (logged) and is retried at the next look, like the
// certificates.
//
// Thread-safe.
#ifndef WSYNC_CONTROLLER_SERVER_REVOCATION_H_
#define WSYNC_CONTROLLER_SERVER_REVOCATION_H_

#include <openssl/x509.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/server/watched_file.h"

namespace wsync::controller {

// What one file revokes: (issuer name, serial) pairs, both as text
// (issuer in OpenSSL's one-line RFC 2253 form, serial in upper-case hex).
struct Revocations {
  std::set<std::pair<std::string, std::string>> revoked;
  int lists = 0;    // CRLs in the file
  int skipped = 0;  // of them, of issuers not in --tls_client_ca (in `pending`)
  // The CRLs of issuers outside the bundle, by issuer, verified per call
  // against the presented chain (see above).
  std::multimap<std::string, std::shared_ptr<X509_CRL>> pending;
};

// Parses `crl_pem` (one or more PEM CRLs) and verifies each against the
// certificates of `ca_pem` (see above); INVALID_ARGUMENT naming `file` and
// what is wrong (no CRL, a bad signature).
absl::StatusOr<Revocations> ParseRevocations(absl::string_view crl_pem, absl::string_view ca_pem,
                                             absl::string_view file);

class RevocationList {
 public:
  // Loads `crl_file` (verified against `ca_file`, the client CA bundle).
  static absl::StatusOr<std::unique_ptr<RevocationList>> Create(std::string crl_file,
                                                                std::string ca_file,
                                                                absl::Duration reload_interval);

  // OK unless the leaf certificate `cert_pem` (or a certificate of
  // `chain_pem`, which may be empty) is revoked: then UNAUTHENTICATED naming
  // `method`, the serial, the issuer and the file. A certificate that does
  // not parse is UNAUTHENTICATED too.
  absl::Status Check(absl::string_view cert_pem, absl::string_view chain_pem,
                     absl::string_view method);

  const std::string& file() const { return crl_.path(); }

 private:
  RevocationList(std::string crl_file, std::string ca_file, absl::Duration reload_interval)
      : crl_(std::move(crl_file), "--tls_crl_file", reload_interval),
        ca_(std::move(ca_file), "--tls_client_ca", reload_interval) {}
  // Re-reads both files when either changed (at most once per reload
  // interval); errors keep the loaded lists, and the next look retries.
  absl::Status ReloadIfChanged() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Reload(const absl::StatusOr<bool>& crl_changed,
                      const absl::StatusOr<bool>& ca_changed) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex reload_mu_;  // held for a whole reload (taken before mu_)
  WatchedFile crl_;
  WatchedFile ca_;
  absl::Mutex mu_;
  std::shared_ptr<const Revocations> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_REVOCATION_H_
