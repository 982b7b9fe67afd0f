// The CUDA backend's direct writer: puts from this GPU into peers' memory
// mapped by CUDA IPC with peer access (CudaBackend::OpenBuffer, peer = true;
// possibly on another GPU).
//
// Puts run on their own streams so they overlap the data ops' stream (local
// copies, packs, NCCL): sources are trainer tensors that nothing in a sync
// writes, and callers put only after a host-synchronous handshake (the ready
// tokens), so the put streams never wait for the ops' stream. Big plain
// copies go to the copy engines, the rest (casts, small pieces, > 2 dims)
// into one piece-kernel launch. A call's copy list and kernel table are kept
// resident under its items, and a prepared list (ItemsHandle) finds them by
// its handle, so a replayed sync uploads nothing. The token bytes move on a
// stream of their own, not ordered behind queued copies; so do the mailbox's
// (cuda_mailbox.h).
//
// The writer belongs to one CudaDataOps (same device): memory it outgrows is
// retired into the ops' RetiredMemory and freed by their Synchronize(), never
// while a transfer may be in flight. Not thread-safe: use the writer and its
// ops from one thread.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_PEER_WRITER_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_PEER_WRITER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "worker/backends/cuda/batched_kernels.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/cuda_mailbox.h"
#include "worker/backends/cuda/piece_table.h"
#include "worker/backends/cuda/put_list.h"
#include "worker/plane/peer_writer.h"

namespace wsync::cuda {

class CudaPeerWriter : public exec::PeerWriter {
 public:
  // A writer beside `ops` (not owned; outlives the writer), configured by
  // the put_* fields of the ops' options.
  static absl::StatusOr<std::unique_ptr<CudaPeerWriter>> Create(CudaDataOps* ops);
  ~CudaPeerWriter() override;

  std::string Name() const override;
  exec::MemorySpace memory_space() const override { return exec::MemorySpace::kCuda; }
  // Also leaves the ops' copy kernels' put_reserved_sms SMs to the puts
  // (CudaDataOps::ReserveSmsForPuts) while the last list prepared is not
  // empty: an empty one (a plan without puts) gives them back, and so does
  // the writer's destruction.
  exec::ItemsHandle Prepare(absl::Span<const exec::CopyItem> items) override;

  // On the put streams, in call order. Callers make the peer's memory
  // reachable (peer access: cudaIpcOpenMemHandle with
  // cudaIpcMemLazyEnablePeerAccess, as IpcRegistry does) before putting.
  absl::Status Put(absl::Span<const exec::CopyItem> items, exec::ItemsHandle handle,
                   bool alone) override;
  // Waits for every put stream.
  absl::Status Fence() override;
  // An event recorded on every put stream; PollMark queries them (and drops
  // the mark once reached). Marks of one writer are reached in order.
  absl::StatusOr<uint64_t> Mark() override;
  absl::StatusOr<bool> PollMark(uint64_t mark) override;
  absl::StatusOr<uint8_t*> TokenSlots(size_t count) override;
  absl::Status WriteToken(uint8_t* slot, uint64_t value) override;
  absl::StatusOr<uint64_t> ReadToken(const uint8_t* slot) override;

  bool HasMailbox() const override { return true; }
  absl::StatusOr<std::string> CreateMailbox(int64_t slots) override {
    return mailboxes_->CreateMailbox(slots);
  }
  absl::Status OpenPeerMailbox(int32_t peer, const std::string& descriptor) override {
    return mailboxes_->OpenPeer(peer, descriptor);
  }
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value) override {
    return mailboxes_->Post(peer, slot, value);
  }
  absl::StatusOr<uint64_t> ReadMailbox(int64_t slot) override { return mailboxes_->Read(slot); }
  // Put gates on the put streams (cuda_mailbox.h's kernels): a signal after
  // every put stream's work so far, a wait that every later put follows.
  absl::Status SignalAfterPuts(absl::Span<const GatePost> posts) override;
  absl::Status GatePuts(absl::Span<const GateWait> waits, absl::Duration timeout) override;
  absl::StatusOr<int64_t> GatesTimedOut() override { return mailboxes_->gates_timed_out(); }

  cudaStream_t put_stream() const { return put_stream_.get(); }
  // Kernel launches, resident-table hits, and copies and bytes sent to the
  // copy engines so far (benchmarks report them).
  int64_t launches() const { return put_kernels_->launches() + put_kernels_alone_->launches(); }
  int64_t table_cache_hits() const { return cache_hits_; }
  int64_t copy_engine_copies() const { return copy_engine_copies_; }
  int64_t copy_engine_bytes() const { return copy_engine_bytes_; }

 private:
  // A Put call kept for replay: its copy-engine copies, then its resident
  // table (empty when every put went to the copy engines).
  struct CachedPut {
    std::vector<PutCopy> copies;
    int64_t copy_bytes = 0;
    DeviceBuffer table;
    TableLayout layout;
  };

  explicit CudaPeerWriter(CudaDataOps* ops) : ops_(ops), device_(ops->device()) {}
  absl::Status Init(const CudaDataOps::Options& options);
  // Adds put src -> dst (validated, equal element counts) to `put_list_`:
  // a copy when it qualifies for the copy engines, else a kernel request.
  // The device `dst` lies on, for PutList (0 when the interleaving is off).
  int PeerOf(const void* dst) const;
  absl::Status AddPutRequest(const exec::StridedView& src, const exec::StridedView& dst,
                             size_t index);
  // Every non-empty item: those `via_scratch` names (ascending; shapes with
  // no common refinement) first go src -> a contiguous copy in the source
  // dtype in put scratch, through `pre_table_`; then to AddPutRequest.
  absl::Status AddItems(absl::Span<const exec::CopyItem> items,
                        const std::vector<size_t>& via_scratch);
  // Enqueues `copies` (`bytes` in all) on the put streams.
  // `one_stream`: every copy on the put stream, in order after what it holds
  // (copies that read put scratch filled by a kernel there).
  absl::Status IssuePutCopies(const std::vector<PutCopy>& copies, int64_t bytes,
                              bool one_stream = false);
  // Runs `put_copies_` and `table_` on the put stream and keeps them resident
  // under `key` (unless empty). Empty key: not cached, and the copies read
  // put scratch (one stream).
  absl::Status RunPut(std::string key);
  // Puts under the items' cache key, or replaying `known` (an entry a
  // prepared list resolved to).
  absl::Status PutKeyed(absl::Span<const exec::CopyItem> items, bool alone, std::string key,
                        CachedPut* known = nullptr);
  absl::Status SynchronizePuts();
  // The put stream waits for every copy stream's work so far (join), or
  // every copy stream for the put stream's (fork).
  absl::Status JoinPutStreams();
  absl::Status EnsureGateEvents();
  absl::Status ForkPutStreams();

  CudaDataOps* const ops_;
  bool reserved_sms_ = false;  // this writer made ops_ leave SMs to its puts
  const int device_;
  int64_t table_cache_bytes_ = 0;
  RetiredMemory* retired_ = nullptr;  // the ops'
  Stream put_stream_;                 // put kernels and the first share of copies
  // The direct-write tokens' few bytes: not ordered behind queued copies.
  Stream staging_io_stream_;
  std::vector<Stream> put_copy_streams_;               // the other shares of copy-engine puts
  std::unique_ptr<BatchedKernels> put_kernels_;        // beside the ops' kernels
  std::unique_ptr<BatchedKernels> put_kernels_alone_;  // Put(..., alone): the whole device
  BatchedKernels* put_launcher_ = nullptr;             // the one of the current Put
  int64_t put_min_bytes_ = 0;
  int64_t put_min_row_bytes_ = 0;
  int64_t max_pitch_ = 0;  // cudaDevAttrMaxPitch: larger pitches stay on the kernel
  int64_t put_interleave_bytes_ = 0;
  PutList put_list_;  // the current call's puts, before Emit
  PieceTable table_;
  PieceTable pre_table_;  // copies into put scratch, before table_
  std::vector<PutCopy> put_copies_;
  int64_t put_copies_bytes_ = 0;
  DeviceBuffer put_scratch_;
  // Keyed by the items; entries never move (put_named_ points at them). A
  // prepared list resolves to its items' entry once, then by handle.
  absl::node_hash_map<std::string, CachedPut> put_cache_;
  absl::flat_hash_map<std::string, CachedPut*> put_named_;
  int64_t put_cache_bytes_ = 0;
  int64_t cache_hits_ = 0;
  int64_t copy_engine_copies_ = 0;
  int64_t copy_engine_bytes_ = 0;
  exec::StagingBuffer tokens_;  // device memory from the ops' staging pool
  // Put marks not yet reached (one event per put stream each), and events
  // of reached ones for reuse.
  absl::flat_hash_map<uint64_t, std::vector<Event>> marks_;
  std::vector<Event> spare_events_;
  uint64_t last_mark_ = 0;
  std::unique_ptr<CudaMailboxes> mailboxes_;
  std::vector<Event> gate_events_;  // one per copy stream, then the put stream's
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_PEER_WRITER_H_
