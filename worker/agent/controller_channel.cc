#include "worker/agent/controller_channel.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace wsync::agent {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ControllerCredentials(
    const ControllerTls& tls) {
  if (tls.insecure) {
    if (!tls.ca_file.empty() || !tls.cert_file.empty() || !tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "--insecure is plaintext: drop --controller_ca / --cert / --key, or --insecure");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS to the controller needs --controller_ca (or --insecure for a plaintext "
        "controller)");
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  for (const std::string* f : {&tls.ca_file, &tls.cert_file, &tls.key_file}) {
    if (!f->empty() && !std::ifstream(*f)) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read TLS file '", *f, "'"));
    }
  }
  const auto seconds = static_cast<unsigned int>(std::max(1, tls.reload_seconds));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.ca_file, seconds);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!tls.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The controller's certificate must name the host dialed (SAN DNS / IP).
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace wsync::agent
