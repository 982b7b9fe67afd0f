// A gRPC channel to the controller from wsyncctl's flags: TLS (mutual with
// --cert / --key) when --controller_ca is given, plaintext otherwise (a
// --insecure controller); --tls_server_name overrides the name the
// controller's certificate must carry (dialling a pod IP whose certificate
// names the Service). Shared by the subcommands that talk to a controller.
#ifndef WSYNC_TOOLS_CONTROLLER_CHANNEL_H_
#define WSYNC_TOOLS_CONTROLLER_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "tools/args.h"

namespace wsync::tools {

// The flags ControllerChannel reads; add them to a command's FlagSpec.
inline constexpr const char* kChannelFlags[] = {"controller", "controller_ca", "cert", "key",
                                                "tls_server_name"};

// The whole file; NOT_FOUND naming the path when it cannot be read.
absl::StatusOr<std::string> ReadText(const std::string& path);

// Credentials from --controller_ca / --cert / --key. INVALID_ARGUMENT when
// --cert / --key come without --controller_ca or without each other.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ControllerCredentials(const Args& args);

// A channel to --controller with those credentials (and --tls_server_name).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ControllerChannel(const Args& args);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_CONTROLLER_CHANNEL_H_
