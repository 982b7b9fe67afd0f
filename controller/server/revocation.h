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
// certificates. A thread of the list's own looks every reload interval; a
// Check (a gRPC call) looks too. Each load publishes an immutable snapshot
// (a pointer swap): CheckIdentity reads the current one and never waits for a
// load.
//
// Two ways to check: Check parses the certificate a gRPC call presents;
// CheckIdentity checks a certificate parsed once before (IdentifyCertificate,
// at a worker's registration: the control fast lane's calls present none),
// with hash look-ups of its (issuer, serial) pairs only, whatever the CRL's
// size, and no X.509 work unless an intermediate's CRL lists one of them.
//
// Thread-safe.
#ifndef WSYNC_CONTROLLER_SERVER_REVOCATION_H_
#define WSYNC_CONTROLLER_SERVER_REVOCATION_H_

#include <openssl/x509.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "controller/server/watched_file.h"

namespace wsync::controller {

// What one file revokes: (issuer name, serial) pairs, both as text
// (issuer in OpenSSL's one-line RFC 2253 form, serial in upper-case hex).
struct Revocations {
  absl::flat_hash_set<std::pair<std::string, std::string>> revoked;
  int lists = 0;    // CRLs in the file
  int skipped = 0;  // of them, of issuers not in --tls_client_ca (in `pending`)
  // The CRLs of issuers outside the bundle, by issuer, verified per call
  // against the presented chain (see above), and the (issuer, serial) pairs
  // they list (a certificate none of them lists needs no verification).
  std::multimap<std::string, std::shared_ptr<X509_CRL>> pending;
  absl::flat_hash_set<std::pair<std::string, std::string>> pending_revoked;
};

// A certificate and its chain, parsed once: what a lease registered with.
struct CertificateIdentity {
  struct Cert {
    std::string issuer;  // as in Revocations
    std::string serial;
    std::string subject;
    std::shared_ptr<X509> x509;  // for the CRLs of intermediates (`pending`)
  };
  std::vector<Cert> certs;  // the leaf first, then the chain; empty: no leaf parsed
};

// Parses `leaf_pem` and `chain_pem` (may be empty); null when `leaf_pem` is
// empty (no certificate), `certs` empty when it does not parse.
std::shared_ptr<const CertificateIdentity> IdentifyCertificate(absl::string_view leaf_pem,
                                                               absl::string_view chain_pem);

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
  // The same for a certificate parsed before, against the lists loaded now
  // (no file looked at, no parsing, no lock held while checking): an
  // identity without certificates (a leaf that did not parse) is
  // UNAUTHENTICATED.
  absl::Status CheckIdentity(const CertificateIdentity& identity, absl::string_view method) const;

  const std::string& file() const { return crl_.path(); }

  // Stops the reloading thread.
  ~RevocationList();
  RevocationList(const RevocationList&) = delete;
  RevocationList& operator=(const RevocationList&) = delete;

 private:
  RevocationList(std::string crl_file, std::string ca_file, absl::Duration reload_interval)
      : crl_(std::move(crl_file), "--tls_crl_file", reload_interval),
        ca_(std::move(ca_file), "--tls_client_ca", reload_interval),
        reload_interval_(reload_interval) {}
  // ReloadIfChanged, errors logged.
  void ReloadLogged() ABSL_LOCKS_EXCLUDED(reload_mu_);
  // Re-reads both files when either changed (at most once per reload
  // interval); errors keep the loaded lists, and the next look retries.
  absl::Status ReloadIfChanged() ABSL_LOCKS_EXCLUDED(reload_mu_);
  absl::Status Reload(const absl::StatusOr<bool>& crl_changed,
                      const absl::StatusOr<bool>& ca_changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);

  absl::Mutex reload_mu_;  // held for a whole reload
  WatchedFile crl_;
  WatchedFile ca_;
  const absl::Duration reload_interval_;
  // The snapshot: std::atomic_load / std::atomic_store only.
  std::shared_ptr<const Revocations> current_;
  absl::Notification stop_;
  std::thread reloader_;  // looks every reload_interval_ until stop_
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_REVOCATION_H_
