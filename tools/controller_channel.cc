#include "tools/controller_channel.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wsync::tools {

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ControllerCredentials(const Args& args) {
  if (!args.Has("controller_ca")) {
    if (args.Has("cert") || args.Has("key")) {
      return absl::InvalidArgumentError("--cert / --key need --controller_ca (TLS)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadText(args.Value("controller_ca"));
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (args.Has("cert") != args.Has("key")) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  if (args.Has("cert")) {
    absl::StatusOr<std::string> cert = ReadText(args.Value("cert"));
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadText(args.Value("key"));
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ControllerChannel(const Args& args) {
  if (args.Value("controller").empty()) {
    return absl::InvalidArgumentError("--controller HOST:PORT is required");
  }
  if (args.Has("tls_server_name") && !args.Has("controller_ca")) {
    return absl::InvalidArgumentError("--tls_server_name needs --controller_ca (TLS)");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ControllerCredentials(args);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments channel_args;
  if (args.Has("tls_server_name")) {
    channel_args.SetSslTargetNameOverride(args.Value("tls_server_name"));
  }
  return grpc::CreateCustomChannel(args.Value("controller"), *credentials, channel_args);
}

}  // namespace wsync::tools
