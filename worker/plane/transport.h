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
  int32_t step = 0;  // the bucket's step in its round (RunRound); identical on both sides
};

struct RecvRequest {
  int32_t peer = 0;  // transport rank of the sender
  int64_t tag = 0;
  void* data = nullptr;
  size_t bytes = 0;
  int32_t step = 0;
};

// Where some receives of a round became readable on the device, for work
// queued on another stream to wait for (DataOps::WaitForLanding). Opaque and
// valid only during the callback that hands it out; `handle` is the backend's
// (for NCCL a cudaEvent_t), null where the bytes are in memory already (host).
struct LandingMark {
  const void* handle = nullptr;
};

// `recv_indices`: positions in RunRound's `recvs`.
using LandedCallback =
    std::function<void(absl::Span<const size_t> recv_indices, const LandingMark& mark)>;

// What a caller hooks into one RunRound.
struct RoundHooks {
  // Runs exactly once on the calling thread once the round's operations are
  // posted (for NCCL: its kernels are enqueued; with steps, on a transport
  // that waits between them, the first step's) and before RunRound waits for
  // them; at once when there is nothing to post. It does not run when the
  // round fails before all of it is posted (with landing parts, a failure
  // posting a later part after earlier ones went). The executor issues work there that should
  // overlap the transfer: on a GPU, kernels launched after NCCL's are
  // resident beside it instead of holding back its launch until they drain.
  std::function<void()> on_posted;
  // Optional, for work that reads received bytes as they land (bucket
  // checksums). A transport may complete a round in landing parts: within
  // each step (RunRound "Steps"; one step without them), each
  // (peer, direction) list of requests, in (peer, tag) order, is cut by its
  // running byte count into LandingPartCount(its bytes, ...) parts, and the
  // parts move in (step, part) order, part k of every list of a step
  // together. Both sides of a pair cut
  // alike only if every rank passes the same max_landing_parts and
  // min_landing_part_bytes (a precondition: ranks that cut differently may
  // wait on each other until the deadline). It then calls on_landed on the
  // calling thread, after on_posted and before RunRound returns, naming each
  // receive with bytes > 0 that lands before the round's last one at most
  // once, with the mark after which it is readable; the last part's are
  // never named (they land when RunRound returns, and a caller that defers
  // its post-round work keeps them there). Receives it never names are
  // readable when RunRound returns OK. Nothing is promised after a failure.
  // Transports that cannot tell never call it.
  LandedCallback on_landed;
  int32_t max_landing_parts = 1;
  int64_t min_landing_part_bytes = int64_t{64} << 20;
};

// The landing parts of one (peer, direction) list of `list_bytes` bytes:
// min(max_parts, list_bytes / min_part_bytes), at least 1; and the part of a
// request starting `offset` bytes into its list.
int32_t LandingPartCount(int64_t list_bytes, int32_t max_parts, int64_t min_part_bytes);
int32_t LandingPartOf(int64_t offset, int64_t list_bytes, int32_t parts);

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string Name() const = 0;
  virtual MemorySpace memory_space() const = 0;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;

  // Posts every send and receive of one round together (one NCCL group, or
  // one per landing part: RoundHooks) and returns once all completed. Between one pair of ranks,
  // requests are matched by tag; callers list them in the same (peer, tag) order on both sides.
  //
  // Steps: requests run step by step, in increasing `step`. A step's
  // sends and receives are issued once every request of this rank's earlier
  // steps completed (NCCL: in stream order, one group per (step, landing
  // part), round_groups.h, with no host wait between them; Gloo: after
  // waiting for them). So a send of
  // step s may read what a receive of an earlier step wrote, and a receive
  // of step s may overwrite what a send of an earlier step read. Both sides
  // of a request give it the same step (a precondition: a pair that
  // disagrees waits until the deadline).
  // Past `deadline` the transport aborts (the communicator is unusable afterwards) and returns
  // DEADLINE_EXCEEDED naming the pending peers.
  //
  // Semantics every backend shares (ValidateRoundRequests checks the static
  // ones; tests/worker/plane/transport_conformance.h tests all of them):
  //  * bytes == 0 completes at once without communication (both sides know
  //    the size from the plan, so both skip it); data may then be null.
  //  * peer == rank() is INVALID_ARGUMENT: local bytes move through the data
  //    ops (COPY), never through the transport. So are peers outside
  //    [0, size()), null data with bytes > 0, a step outside
  //    [0, kMaxBucketSteps), and a (peer, tag) listed twice in the same
  //    direction within one round.
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
  //  * The hooks (RoundHooks above) run on the calling thread.
  virtual absl::Status RunRound(absl::Span<const SendRequest> sends,
                                absl::Span<const RecvRequest> recvs, absl::Time deadline,
                                const RoundHooks& hooks) = 0;
  absl::Status RunRound(absl::Span<const SendRequest> sends, absl::Span<const RecvRequest> recvs,
                        absl::Time deadline, const std::function<void()>& on_posted) {
    RoundHooks hooks;
    hooks.on_posted = on_posted;
    return RunRound(sends, recvs, deadline, hooks);
  }
  absl::Status RunRound(absl::Span<const SendRequest> sends, absl::Span<const RecvRequest> recvs,
                        absl::Time deadline) {
    return RunRound(sends, recvs, deadline, RoundHooks());
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
