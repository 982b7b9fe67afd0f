// NCCL data plane (built only with WSYNC_WITH_CUDA). One communicator over all
// workers of a transfer, nonblocking (blocking = 0) so that every wait polls
// ncclCommGetAsyncError against a deadline instead of hanging: a dead peer
// turns into DEADLINE_EXCEEDED naming the peers the round was waiting for,
// and the communicator is aborted (rebuild the transport afterwards).
// Each RunRound is one ncclGroupStart/End of ncclSend/ncclRecv, posted in
// (peer, tag) order on both sides so that NCCL's in-order matching per pair
// pairs equal tags; with steps (a request's step > 0) or
// RoundHooks::max_landing_parts > 1, one group per (step, landing part)
// (transport.h), issued back to back on the transport's stream with no host
// wait for completion, each followed by an event that on_landed hands out
// as the part's mark. Stream order makes a step's receives land before the
// next step's sends read them.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_NCCL_TRANSPORT_H_
#define WSYNC_WORKER_BACKENDS_CUDA_NCCL_TRANSPORT_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/plane/kv_store.h"
#include "worker/plane/transport.h"

namespace wsync::transport {

struct NcclTransportOptions {
  int device = 0;  // CUDA device of this rank
  int32_t rank = 0;
  int32_t size = 1;
  // Deadline for every rank to join the communicator.
  absl::Duration init_timeout = absl::Seconds(120);
  // NCCL_MIN_P2P_NCHANNELS for this process, unless the environment sets it
  // (0: NCCL's default; docs/gpu.md "NCCL transport" says why 64). NCCL
  // reads it once, at the process's first communicator.
  int min_p2p_channels = 64;
  // Not owned, may be null: when it turns true, communicator setup and any
  // round in flight end with CANCELLED (the worker's abort of a sync; without
  // it a dead peer during setup would hold the caller until init_timeout).
  const std::atomic<bool>* cancel = nullptr;
};

// Owns an ncclComm_t: aborts it if never finalized cleanly.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  NcclComm(NcclComm&& o) noexcept : comm_(o.comm_) { o.comm_ = nullptr; }
  NcclComm& operator=(NcclComm&& o) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() { Abort(); }

  ncclComm_t get() const { return comm_; }
  // Immediate teardown (in-flight operations are cancelled).
  void Abort();
  // Flushes and destroys; aborts instead past `deadline`.
  absl::Status Finalize(absl::Time deadline);

 private:
  ncclComm_t comm_ = nullptr;
};

// Serializes / parses an ncclUniqueId for a key-value store.
std::string UniqueIdToBytes(const ncclUniqueId& id);
absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(const std::string& bytes);
absl::StatusOr<ncclUniqueId> NewUniqueId();

class NcclTransport : public Transport {
 public:
  // Every rank passes the same id (rank 0 made it with NewUniqueId and shared
  // it through the rendezvous store).
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(const ncclUniqueId& id,
                                                               const NcclTransportOptions& opts);
  // Rendezvous through `store`: rank 0 makes the id and publishes it under
  // `prefix` (unique per transport generation), the others wait for it
  // within opts.init_timeout.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(KvStore& store,
                                                               const std::string& prefix,
                                                               const NcclTransportOptions& opts);
  ~NcclTransport() override;

  std::string Name() const override { return "nccl"; }
  MemorySpace memory_space() const override { return MemorySpace::kCuda; }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  using Transport::RunRound;
  absl::Status RunRound(absl::Span<const SendRequest> sends, absl::Span<const RecvRequest> recvs,
                        absl::Time deadline, const RoundHooks& hooks) override;
  void Abort(const std::string& reason) override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  bool aborted() const { return aborted_.load(); }

 private:
  NcclTransport() = default;
  // Polls until the communicator leaves ncclInProgress (and, with `event`,
  // until the event completes); aborts past the deadline or on Abort().
  // Polls until the group is issued (then records `event`, if any, and runs
  // `on_issued`) and, with an event, until the event completes.
  absl::Status Wait(absl::Time deadline, const cuda::Event* event, const std::string& what,
                    const std::function<void()>& on_issued = nullptr);
  void AbortLocked(const std::string& why);
  // One ncclGroupStart/End of `s` and `r` (each in (peer, tag) order); aborts
  // the communicator on failure.
  absl::Status PostGroup(const std::vector<const SendRequest*>& s,
                         const std::vector<const RecvRequest*>& r, const std::string& what);

  int device_ = 0;
  int32_t rank_ = 0;
  int32_t size_ = 1;
  cuda::Stream stream_;
  cuda::Event done_;
  std::vector<cuda::Event> part_events_;  // landing parts but the last (done_)
  std::mutex mu_;                         // one RunRound at a time; guards comm_
  NcclComm comm_;
  std::atomic<bool> abort_requested_{false};
  const std::atomic<bool>* cancel_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::mutex reason_mu_;
  std::string abort_reason_;
};

}  // namespace wsync::transport

#endif  // WSYNC_WORKER_BACKENDS_CUDA_NCCL_TRANSPORT_H_
