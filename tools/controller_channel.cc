#include "tools/controller_channel.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tools/cli.h"

namespace wsync::tools {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

void AddChannelOptions(CLI::App& app, ChannelOptions* o, int64_t default_timeout_ms) {
  o->timeout_ms = default_timeout_ms;
  app.add_option("--controller", o->controller, "the controller's trainer API address")
      ->type_name("HOST:PORT");
  app.add_option("--controller_ca,--tls_ca", o->ca,
                 "PEM of the CA of the controller's certificate: TLS (plaintext without it)")
      ->type_name("PEM");
  app.add_option("--cert,--tls_cert", o->cert, "client certificate for mutual TLS")
      ->type_name("PEM");
  app.add_option("--key,--tls_key", o->key, "its private key")->type_name("PEM");
  app.add_option("--tls_server_name", o->tls_server_name,
                 "the name the controller's certificate carries (dialling a pod IP)")
      ->type_name("NAME");
  app.add_option("--token", o->token, "bearer token of the controller's --tokens_file")
      ->type_name("TOKEN");
  app.add_option("--token_file", o->token_file, "file holding that bearer token")
      ->type_name("FILE");
  app.add_flag("--insecure", o->insecure,
               "plaintext (a --insecure controller); the default "
               "without --controller_ca");
  app.add_option("--timeout_ms", o->timeout_ms, "deadline of each call (0: none)")
      ->capture_default_str()
      ->type_name("MS");
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void Controller::Prepare(grpc::ClientContext* ctx, int64_t timeout_ms) const {
  if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  if (timeout_ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  }
}

std::optional<Controller> ConnectForCommand(const CLI::App& app, const ChannelOptions& options,
                                            int* exit) {
  absl::StatusOr<Controller> controller = ConnectController(options);
  if (controller.ok()) return *std::move(controller);
  *exit = UsageError(app, std::string(controller.status().message()));
  return std::nullopt;
}

absl::StatusOr<Controller> ConnectController(const ChannelOptions& o) {
  if (o.controller.empty()) {
    return absl::InvalidArgumentError("--controller HOST:PORT is required");
  }
  const bool tls = !o.ca.empty();
  if (!tls && (!o.cert.empty() || !o.key.empty())) {
    return absl::InvalidArgumentError("--cert / --key need --controller_ca (TLS)");
  }
  if (!tls && !o.tls_server_name.empty()) {
    return absl::InvalidArgumentError("--tls_server_name needs --controller_ca (TLS)");
  }
  if (tls && o.insecure) {
    return absl::InvalidArgumentError("--insecure (plaintext) contradicts --controller_ca (TLS)");
  }
  if (o.cert.empty() != o.key.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  if (!o.token.empty() && !o.token_file.empty()) {
    return absl::InvalidArgumentError("--token and --token_file: give one of them");
  }
  Controller c;
  c.address = o.controller;
  c.token = o.token;
  if (!o.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadText(o.token_file);
    if (!text.ok()) return text.status();
    c.token = std::string(absl::StripAsciiWhitespace(*text));
  }
  if (!tls && !o.insecure && !c.token.empty()) {
    return absl::InvalidArgumentError(
        "a bearer token would travel in plaintext: give --controller_ca (TLS), or --insecure "
        "to send it in plaintext anyway");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments channel_args;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadText(o.ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!o.cert.empty()) {
      absl::StatusOr<std::string> cert = ReadText(o.cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadText(o.key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) channel_args.SetSslTargetNameOverride(o.tls_server_name);
  }
  c.channel = grpc::CreateCustomChannel(o.controller, credentials, channel_args);
  return c;
}

std::string DescribeRpcError(const grpc::Status& status) {
  std::string out = absl::StrCat(CodeName(status.error_code()), ": ", status.error_message());
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    absl::StrAppend(&out,
                    " (pass --token or --token_file with a token of the controller's "
                    "--tokens_file, or a client certificate with --cert / --key)");
  } else if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    absl::StrAppend(&out,
                    " (the token or certificate lacks the role this call needs; "
                    "docs/security.md lists the roles)");
  }
  return out;
}

}  // namespace wsync::tools
