// The one interface every data-plane backend implements (host: Gloo over TCP;
// GPU: NCCL). It only moves bytes between workers; packing, casting and
// reducing belong to the op-list interpreter, shared by all backends.
#ifndef WSYNC_WORKER_PLANE_TRANSPORT_H_
#define WSYNC_WORKER_PLANE_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace wsync::transport {

// Where the bytes a transport moves must live.
enum class MemorySpace { kHost, kCuda };

struct SendRequest {
  int32_t peer = 0;  // transport rank of the receiver
  int64_t tag = 0;   // the bucket id; identical on both sides
  const void* data = nullptr;
  size_t bytes = 0;
};

struct RecvRequest {
  int32_t peer = 0;  // transport rank of the sender
  int64_t tag = 0;
  void* data = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string Name() const = 0;
  virtual MemorySpace memory_space() const = 0;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;

  // Posts every send and receive of one round together (one NCCL group) and
  // returns once all completed. Between one pair of ranks, requests are
  // matched by tag; callers list them in the same (peer, tag) order on both
  // sides. Past `deadline` the transport aborts (the communicator is unusable
  // afterwards) and returns DEADLINE_EXCEEDED naming the pending peers.
  //
  // Semantics every backend shares (ValidateRoundRequests checks the static
  // ones; tests/worker/plane/transport_conformance.h tests all of them):
  //  * bytes == 0 completes at once without communication (both sides know
  //    the size from the plan, so both skip it); data may then be null.
  //  * peer == rank() is INVALID_ARGUMENT: local bytes move through the data
  //    ops (COPY), never through the transport. So are peers outside
  //    [0, size()), null data with bytes > 0, and a (peer, tag) listed twice
  //    in the same direction within one round.
  //  * A lost peer connection may end the round before the deadline with
  //    UNAVAILABLE naming the peer; Abort() ends it with CANCELLED.
  //  * A silent peer stalls the ranks that wait on it; it may also stall a
  //    third rank whose only partner is a rank that waits on it (NCCL
  //    progresses one group's operations together), which then fails at its
  //    own deadline naming its partner.
  //    The first failure (by time) names the silent peer.
  //  * After any failed round the transport is unusable: later rounds return
  //    CANCELLED (after Abort) or FAILED_PRECONDITION, without communicating.
  //  * When RunRound returns, the transport no longer touches any request's
  //    memory, whatever the outcome.
  //  * `on_posted` (may be empty) runs exactly once on the calling thread
  //    once the round's operations are posted (for NCCL: its kernels are
  //    enqueued) and before RunRound waits for them; at once when there is
  //    nothing to post. It does not run when the round fails before posting.
  //    The executor issues work there that should overlap the transfer: on a
  //    GPU, kernels launched after NCCL's are resident beside it instead of
  //    holding back its launch until they drain.
  virtual absl::Status RunRound(absl::Span<const SendRequest> sends,
                                absl::Span<const RecvRequest> recvs, absl::Time deadline,
                                const std::function<void()>& on_posted) = 0;
  absl::Status RunRound(absl::Span<const SendRequest> sends, absl::Span<const RecvRequest> recvs,
                        absl::Time deadline) {
    return RunRound(sends, recvs, deadline, nullptr);
  }

  // Makes any RunRound in flight (on another thread) fail promptly; the
  // transport must be rebuilt afterwards. Safe to call more than once.
  virtual void Abort(const std::string& reason) = 0;
};

// The static request checks of RunRound (see above), for every backend.
absl::Status ValidateRoundRequests(int32_t rank, int32_t size, absl::Span<const SendRequest> sends,
                                   absl::Span<const RecvRequest> recvs);

}  // namespace wsync::transport

#endif  // WSYNC_WORKER_PLANE_TRANSPORT_H_
