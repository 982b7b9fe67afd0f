// A transport that forwards every call to the one it wraps, for tests that
// watch or alter one call (Cluster::WrapTransport): a subclass overrides
// what it changes (usually RunRound) and calls inner() for the rest.
#ifndef WSYNC_TESTS_WORKER_EXEC_FORWARDING_TRANSPORT_H_
#define WSYNC_TESTS_WORKER_EXEC_FORWARDING_TRANSPORT_H_

#include <memory>
#include <string>
#include <utility>

#include "worker/plane/transport.h"

namespace wsync::exec::testing {

class ForwardingTransport : public transport::Transport {
 public:
  // `inner` must not be null.
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}
  std::string Name() const override { return inner_->Name(); }
  transport::MemorySpace memory_space() const override { return inner_->memory_space(); }
  int32_t rank() const override { return inner_->rank(); }
  int32_t size() const override { return inner_->size(); }
  absl::Status RunRound(absl::Span<const transport::SendRequest> sends,
                        absl::Span<const transport::RecvRequest> recvs, absl::Time deadline,
                        const transport::RoundHooks& hooks) override {
    return inner_->RunRound(sends, recvs, deadline, hooks);
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 protected:
  transport::Transport& inner() { return *inner_; }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_FORWARDING_TRANSPORT_H_
