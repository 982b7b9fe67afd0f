// Host-memory Transport over Gloo's TCP transport: one full mesh of TCP pairs
// set up through a KvStore rendezvous, unbound buffers for every request
// (slot = tag), and deadline-bounded waits so that a silent or dead peer
// ends a round with an error naming it instead of a hang.
#ifndef WSYNC_WORKER_BACKENDS_HOST_GLOO_TRANSPORT_H_
#define WSYNC_WORKER_BACKENDS_HOST_GLOO_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/plane/kv_store.h"
#include "worker/plane/transport.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace wsync::transport {

struct GlooTransportOptions {
  int32_t rank = 0;
  int32_t size = 1;
  // Not owned; used only inside Create().
  KvStore* store = nullptr;
  // Namespace of this rendezvous in the store; must be unique per transport
  // generation (a rebuilt transport after Abort uses a new prefix).
  std::string prefix = "wsync";
  // Address to listen on and advertise (default loopback), or a network
  // interface name (takes precedence when set).
  std::string hostname = "127.0.0.1";
  std::string iface;
  // Rendezvous and connection setup must finish within this time and by
  // `deadline` (the sync's), whichever comes first; connecting never
  // outlives it (see gloo_mesh.h).
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Time deadline = absl::InfiniteFuture();
  // Not owned, may be null: once true, connecting ends with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

class GlooTransport : public Transport {
 public:
  // Rendezvous with every other rank. DEADLINE_EXCEEDED naming the peer
  // rank that did not publish its address or connect in time, CANCELLED once
  // `cancel` is set, UNAVAILABLE naming a peer that refused or dropped.
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Create(const GlooTransportOptions& options);
  ~GlooTransport() override;

  std::string Name() const override { return "gloo-tcp"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  using Transport::RunRound;
  absl::Status RunRound(absl::Span<const SendRequest> sends, absl::Span<const RecvRequest> recvs,
                        absl::Time deadline, const RoundHooks& hooks) override;
  void Abort(const std::string& reason) override;

 private:
  GlooTransport(int32_t rank, int32_t size, std::shared_ptr<gloo::Context> context);
  // Closes every pair so that no pending operation touches caller memory
  // after a failed round; the transport refuses further rounds.
  void Break(const std::string& why);

  const int32_t rank_;
  const int32_t size_;
  std::shared_ptr<gloo::Context> context_;

  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string broken_reason_ ABSL_GUARDED_BY(mu_);  // non-empty: unusable
  // Buffers of the round in flight, for Abort.
  std::vector<gloo::transport::UnboundBuffer*> inflight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::transport

#endif  // WSYNC_WORKER_BACKENDS_HOST_GLOO_TRANSPORT_H_
