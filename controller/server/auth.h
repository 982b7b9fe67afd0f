// Authentication and authorization of the controller's callers
// (docs/security.md).
//
// Identities:
//  - A client certificate (mutual TLS, verified against --tls_client_ca): its
//    URI SANs. `wsync://group/<group>` lets the holder register worker ranks
//    of <group> (one SAN per group; a colocated worker carries several);
//    `wsync://role/<role>` gives the holder a trainer-API role. The identity
//    seen in errors and in ListWorkers is the sorted URI SANs joined by ",".
//  - A bearer token ("authorization: Bearer <token>" metadata), looked up in
//    --tokens_file (lines "<token> <role> <name>"; '#' starts a comment); its
//    identity is "token:<name>". A token wins over a certificate's role.
//
// Roles (each includes the ones below it):
//  - reader: GetStatus, ListWorkers, Replicas, Plan, WaitSync, WatchSync.
//  - trainer: DefineTransfer, Sync, Cancel of the transfers it owns (the
//    coordinator checks ownership, sync_coordinator.h TrainerCaller).
//  - admin: all of these on every transfer.
//
// Plaintext (--insecure): no certificates; the worker API trusts the lease
// secret alone; the trainer API needs a token only when --tokens_file is set
// (otherwise every caller is admin).
//
// Revocation: with --tls_crl_file, a client certificate listed in a CRL is
// refused (revocation.h), whatever token comes with it.
//
// Thread-safe. The tokens file is re-read when it changes (checked at most
// once a second); certificates are re-read by gRPC's file watcher, the CRL
// file every reload_interval.
#ifndef WSYNC_CONTROLLER_SERVER_AUTH_H_
#define WSYNC_CONTROLLER_SERVER_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls_file_stage.h"
#include "controller/server/revocation.h"
#include "controller/server/watched_file.h"
#include "controller/server/worker_registry.h"
#include "grpcpp/grpcpp.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

enum class Role { kNone = 0, kReader = 1, kTrainer = 2, kAdmin = 3 };

absl::string_view RoleName(Role role);
// "reader", "trainer" or "admin"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// URI SAN prefixes of the naming rule above.
inline constexpr absl::string_view kGroupUriPrefix = "wsync://group/";
inline constexpr absl::string_view kRoleUriPrefix = "wsync://role/";

struct AuthOptions {
  bool insecure = false;       // plaintext, no certificates (logs a warning)
  std::string cert_file;       // the controller's certificate chain (PEM)
  std::string key_file;        // its private key (PEM)
  std::string client_ca_file;  // CA bundle of client certificates; empty: none accepted
  std::string tokens_file;     // bearer tokens; empty: none
  std::string crl_file;        // PEM CRLs of --tls_client_ca's CAs; empty: none (revocation.h)
  absl::Duration reload_interval = absl::Seconds(10);  // certificate file checks
};

// Who called, as the transport and the request metadata say.
struct Caller {
  std::string identity;             // "" when anonymous
  std::vector<std::string> groups;  // worker groups its certificate grants
  Role role = Role::kNone;
  bool has_certificate = false;
  bool has_token = false;  // presented one (known or not)
};

// One line of the tokens file.
struct TokenEntry {
  std::string token;
  Role role = Role::kNone;
  std::string name;
};
// Parses a tokens file's text; INVALID_ARGUMENT naming the bad line.
absl::StatusOr<std::vector<TokenEntry>> ParseTokens(absl::string_view text, absl::string_view file);

class Authenticator {
 public:
  // Validates the options (files readable; TLS needs cert and key unless
  // insecure) and loads the tokens.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(AuthOptions options);

  bool insecure() const { return options_.insecure; }
  // TLS credentials reloading the files every reload_interval, as whole
  // usable sets (common/tls_file_stage.h; client certificates optional but
  // verified when --tls_client_ca is set), or plaintext ones when insecure.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  Caller Identify(const grpc::ServerContextBase& ctx);

  // Trainer API: OK when the caller holds `needed` or a higher role;
  // UNAUTHENTICATED naming what was missing (no credentials, unknown token);
  // PERMISSION_DENIED naming the role needed and the identity seen.
  absl::StatusOr<Caller> RequireRole(const grpc::ServerContextBase& ctx, Role needed,
                                     absl::string_view method);
  // The same for a caller that presents only a bearer token (`token`; empty:
  // none), as on the control fast lane (lane_server.h): no certificate, so
  // with TLS and without --tokens_file it is UNAUTHENTICATED.
  absl::StatusOr<Caller> RequireRoleByToken(absl::string_view token, Role needed,
                                            absl::string_view method);
  // Worker API: the calling worker (identity "" when insecure), or
  // UNAUTHENTICATED when a TLS caller has no client certificate.
  // Both refuse a client certificate revoked by --tls_crl_file
  // (UNAUTHENTICATED naming its serial), a token notwithstanding.
  absl::StatusOr<Caller> RequireWorker(const grpc::ServerContextBase& ctx,
                                       absl::string_view method);
  // The client certificate `ctx` presented (empty when none), kept with a
  // worker's lease (WorkerRegistry::RegisterWorker).
  static LeaseCertificate PresentedCertificate(const grpc::ServerContextBase& ctx);
  // UNAUTHENTICATED naming `method` and the serial when `cert` (a lease's
  // certificate, parsed at registration) is revoked by --tls_crl_file as
  // loaded now; OK without a CRL or a certificate (null). The control fast
  // lane runs it on each worker call, as RequireWorker does for the
  // certificate a gRPC call presents; no parsing, no wait for a CRL reload.
  absl::Status CheckRevokedCertificate(const CertificateIdentity* cert,
                                       absl::string_view method) const;
  // The caller's certificate grants every group `req` registers in (always
  // OK when insecure); PERMISSION_DENIED naming the group and the identity.
  absl::Status CheckGroups(const Caller& caller, const v1::RegisterWorkerRequest& req) const;

 private:
  explicit Authenticator(AuthOptions options)
      : options_(std::move(options)),
        tokens_file_(options_.tokens_file, "--tokens_file", absl::Seconds(1)) {}
  // UNAUTHENTICATED when the caller's client certificate is revoked.
  absl::Status CheckRevoked(const grpc::ServerContextBase& ctx, absl::string_view method) const;
  absl::Status ReloadTokensIfChanged() ABSL_LOCKS_EXCLUDED(mu_);
  // The role and identity of `token` into *c when it presented one
  // (c->has_token) and it is in --tokens_file.
  void ApplyToken(absl::string_view token, Caller* c) ABSL_LOCKS_EXCLUDED(mu_);
  // RequireRole's decision for an identified caller.
  absl::StatusOr<Caller> CheckRole(Caller c, Role needed, absl::string_view method) const;
  // The entry of `token` (compared in constant time), or null.
  const TokenEntry* FindTokenLocked(absl::string_view token) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const AuthOptions options_;
  std::unique_ptr<RevocationList> crl_;  // null without --tls_crl_file
  // --tls_cert, --tls_key and --tls_client_ca as gRPC reads them (null when
  // insecure).
  std::unique_ptr<TlsFileStage> tls_files_;
  WatchedFile tokens_file_;              // options_.tokens_file
  absl::Mutex mu_;
  std::vector<TokenEntry> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_AUTH_H_
