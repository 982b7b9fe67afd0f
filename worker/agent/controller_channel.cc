#include "worker/agent/controller_channel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace wsync::agent {

absl::StatusOr<ControllerCredentialSet> ControllerCredentials(const ControllerTls& tls) {
  if (tls.insecure) {
    if (!tls.ca_file.empty() || !tls.cert_file.empty() || !tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "--insecure is plaintext: drop --controller_ca / --cert / --key, or --insecure");
    }
    return ControllerCredentialSet{grpc::InsecureChannelCredentials(), nullptr};
  }
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS to the controller needs --controller_ca (or --insecure for a plaintext "
        "controller)");
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  TlsFileStage::Options files;
  files.key = {tls.key_file, "--key"};
  files.cert = {tls.cert_file, "--cert"};
  files.ca = {tls.ca_file, "--controller_ca"};
  files.interval = absl::Seconds(std::max(1, tls.reload_seconds));
  absl::StatusOr<std::unique_ptr<TlsFileStage>> stage = TlsFileStage::Start(std::move(files));
  if (!stage.ok()) return stage.status();
  ControllerCredentialSet set;
  set.files = *std::move(stage);
  // The staged copies change only as whole sets, at most once per interval:
  // looking at them every second costs nothing and adds at most 1 s.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      set.files->key_path(), set.files->cert_path(), set.files->ca_path(), 1);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!tls.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The controller's certificate must name the host dialed (SAN DNS / IP).
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  set.credentials = grpc::experimental::TlsCredentials(options);
  return set;
}

}  // namespace wsync::agent
