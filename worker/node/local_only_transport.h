// The transport of a plan that moves nothing over the network (only local
// copies, or nothing at all for this worker): it has a rank but refuses any
// request, so a plan that needs a network never runs on it silently.
#ifndef WSYNC_WORKER_NODE_LOCAL_ONLY_TRANSPORT_H_
#define WSYNC_WORKER_NODE_LOCAL_ONLY_TRANSPORT_H_

#include <functional>
#include <string>

#include "worker/plane/transport.h"

namespace wsync::node {

class LocalOnlyTransport : public transport::Transport {
 public:
  LocalOnlyTransport(int32_t rank, int32_t size,
                     transport::MemorySpace space = transport::MemorySpace::kHost)
      : rank_(rank), size_(size), space_(space) {}
  std::string Name() const override { return "local-only"; }
  transport::MemorySpace memory_space() const override { return space_; }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  using transport::Transport::RunRound;
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const transport::RoundHooks& hooks) override;
  void Abort(const std::string& reason) override {}

 private:
  const int32_t rank_;
  const int32_t size_;
  const transport::MemorySpace space_;
};

}  // namespace wsync::node

#endif  // WSYNC_WORKER_NODE_LOCAL_ONLY_TRANSPORT_H_
