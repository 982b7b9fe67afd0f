// The CUDA backend's mailboxes (PeerWriter's mailbox contract): this
// writer's mailbox is cudaMalloc'd device memory exported with
// cudaIpcGetMemHandle; a peer's is opened with cudaIpcOpenMemHandle (peer
// access enabled lazily, as IpcRegistry does). Posts are 8-byte host-to-device
// copies into the peer's memory, reads 8-byte device-to-host copies, both on
// a stream of their own through pinned memory and synchronous (the caller
// fenced its puts before posting). Put gates (PeerWriter::GatePuts /
// SignalAfterPuts) are kernels on the caller's stream (gate_kernels.h) that
// store into the peers' mapped slots and poll this mailbox's. Not
// thread-safe.
//
// Descriptor (PeerWriter::kMailboxDescriptorBytes): the magic "WSMBXC02" (02: five slots per peer,
// executor.h), the slot count (8 bytes, little endian), the owner's GPU UUID (NUL-terminated in 64
// bytes), the cudaIpcMemHandle_t (64 bytes), a random number of the owner's process and the
// mailbox's device pointer (8 bytes each), zeros. A peer in the same process (workers as threads:
// CUDA IPC refuses one's own handles) uses the pointer directly.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_MAILBOX_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_MAILBOX_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/plane/peer_writer.h"

namespace wsync::cuda {

class CudaMailboxes {
 public:
  static absl::StatusOr<std::unique_ptr<CudaMailboxes>> Create(int device);
  ~CudaMailboxes();  // closes the peers' mappings
  CudaMailboxes(const CudaMailboxes&) = delete;
  CudaMailboxes& operator=(const CudaMailboxes&) = delete;

  // As PeerWriter::CreateMailbox / OpenPeerMailbox / Post / ReadMailbox.
  absl::StatusOr<std::string> CreateMailbox(int64_t slots);
  absl::Status OpenPeer(int32_t peer, const std::string& descriptor);
  absl::Status Post(int32_t peer, int64_t slot, uint64_t value);
  absl::StatusOr<uint64_t> Read(int64_t slot);
  // Gate kernels on `stream` (after what it holds): every post is checked
  // (an opened peer, a slot inside its mailbox) before any is launched, and
  // so is every wait (a slot of this mailbox).
  absl::Status SignalOn(cudaStream_t stream, absl::Span<const exec::PeerWriter::GatePost> posts);
  absl::Status WaitOn(cudaStream_t stream, absl::Span<const exec::PeerWriter::GateWait> waits,
                      absl::Duration timeout);
  // Waits that opened by their timeout so far (those already run).
  int64_t gates_timed_out() const;

 private:
  struct PeerBox {
    void* base = nullptr;
    int64_t slots = 0;
    bool ipc = true;  // opened by CUDA IPC (else a peer of this process)
  };
  explicit CudaMailboxes(int device) : device_(device) {}
  void ClosePeer(PeerBox& box);
  // Peer access from this device to the device `p` lies on, if another
  // (`what` names the peer in errors).
  absl::Status EnablePeerAccessTo(const void* p, const std::string& what);

  const int device_;
  Stream stream_;
  PinnedBuffer pinned_;  // 24 bytes: [0] posts go from, [1] reads land in, [2] timed-out gates
  unsigned long long* timed_out_device_ = nullptr;  // [2] as the GPU addresses it
  DeviceBuffer own_;
  int64_t own_slots_ = 0;
  std::map<int32_t, PeerBox> peers_;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_MAILBOX_H_
