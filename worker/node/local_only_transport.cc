#include "worker/node/local_only_transport.h"

#include "absl/strings/str_cat.h"

namespace wsync::node {

absl::Status LocalOnlyTransport::RunRound(absl::Span<const transport::SendRequest> sends,
                                          absl::Span<const transport::RecvRequest> recvs,
                                          absl::Time, const transport::RoundHooks& hooks) {
  if (sends.empty() && recvs.empty()) {
    if (hooks.on_posted) hooks.on_posted();
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("worker ", rank_, ": the plan moves no network bytes, yet this round has ",
                   sends.size(), " sends and ", recvs.size(), " receives"));
}

}  // namespace wsync::node
