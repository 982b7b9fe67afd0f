// The worker's credentials towards the controller (docs/security.md): TLS
// verifying the controller against a CA, with the worker's client
// certificate (mutual TLS), files re-read for rotation and handed to gRPC as
// whole sets (common/tls_file_stage.h); or plaintext.
#ifndef WSYNC_WORKER_AGENT_CONTROLLER_CHANNEL_H_
#define WSYNC_WORKER_AGENT_CONTROLLER_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls_file_stage.h"
#include "grpcpp/grpcpp.h"

namespace wsync::agent {

struct ControllerTls {
  bool insecure = false;    // plaintext (the controller runs --insecure)
  std::string ca_file;      // CA of the controller's certificate (PEM)
  std::string cert_file;    // this worker's client certificate chain (PEM)
  std::string key_file;     // its private key
  int reload_seconds = 10;  // how often the files are re-read
};

struct ControllerCredentialSet {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The files the credentials read (null for plaintext): keep it while any
  // channel made with them lives.
  std::shared_ptr<TlsFileStage> files;
};

// INVALID_ARGUMENT when the settings are inconsistent (TLS without a CA,
// a certificate without its key, plaintext with certificate files), a file
// cannot be read, or the key does not match the certificate.
absl::StatusOr<ControllerCredentialSet> ControllerCredentials(const ControllerTls& tls);

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_CONTROLLER_CHANNEL_H_
