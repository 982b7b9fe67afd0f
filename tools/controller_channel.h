// How wsyncctl's controller subcommands reach the controller: the options
// they share (address, TLS, bearer token, per-call timeout), the channel and
// call context built from them, and gRPC errors turned into one clear line.
// TLS (mutual with --cert / --key) when --controller_ca is given, plaintext
// otherwise (a --insecure controller); --tls_server_name overrides the name
// the controller's certificate must carry (dialling a pod IP whose
// certificate names the Service). docs/security.md lists the roles.
#ifndef WSYNC_TOOLS_CONTROLLER_CHANNEL_H_
#define WSYNC_TOOLS_CONTROLLER_CHANNEL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::tools {

struct ChannelOptions {
  std::string controller;       // --controller HOST:PORT (required)
  std::string ca;               // --controller_ca / --tls_ca: PEM of the CA; TLS when set
  std::string cert;             // --cert / --tls_cert: client certificate (mutual TLS)
  std::string key;              // --key / --tls_key
  std::string tls_server_name;  // --tls_server_name
  std::string token;            // --token: bearer token
  std::string token_file;       // --token_file: file holding the bearer token
  bool insecure = false;        // --insecure: plaintext, said explicitly
  int64_t timeout_ms = 10000;   // --timeout_ms: per call (a stream: until its first answer)
};

// Declares the options above on `app`, --timeout_ms defaulting to
// `default_timeout_ms`.
void AddChannelOptions(CLI::App& app, ChannelOptions* options, int64_t default_timeout_ms);

// The whole file; NOT_FOUND naming the path when it cannot be read.
absl::StatusOr<std::string> ReadText(const std::string& path);

// A connected stub's ingredients: the channel and the bearer token.
struct Controller {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::string token;  // empty: none sent
  // Sets the bearer token on `ctx` and a deadline `timeout_ms` from now
  // (none when timeout_ms <= 0).
  void Prepare(grpc::ClientContext* ctx, int64_t timeout_ms) const;
  // Calls the unary TrainerService `method` (e.g. &Stub::GetStatus) with the
  // token and a deadline `timeout_ms` from now.
  template <typename Request, typename Response>
  grpc::Status CallTrainer(grpc::Status (v1::TrainerService::Stub::*method)(grpc::ClientContext*,
                                                                            const Request&,
                                                                            Response*),
                           const Request& request, Response* response, int64_t timeout_ms) const {
    auto stub = v1::TrainerService::NewStub(channel);
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout_ms);
    return ((*stub).*method)(&ctx, request, response);
  }
};

// INVALID_ARGUMENT naming the flag: no --controller, --cert / --key without
// each other or without --controller_ca, --tls_server_name without TLS,
// --insecure with --controller_ca, --token with --token_file; NOT_FOUND when
// a named file cannot be read.
absl::StatusOr<Controller> ConnectController(const ChannelOptions& options);

// For a subcommand: ConnectController, its error logged as a usage error of
// `app` (UsageError) with *exit set to kExitUsage.
std::optional<Controller> ConnectForCommand(const CLI::App& app, const ChannelOptions& options,
                                            int* exit);

// One line for an RPC's failure: "<CODE>: <message>", plus what to do for
// UNAUTHENTICATED (no or unknown token) and PERMISSION_DENIED (the role).
std::string DescribeRpcError(const grpc::Status& status);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_CONTROLLER_CHANNEL_H_
