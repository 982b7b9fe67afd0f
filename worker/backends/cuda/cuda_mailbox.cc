#include "worker/backends/cuda/cuda_mailbox.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/driver_api.h"
#include "worker/backends/cuda/gate_kernels.h"
#include "worker/plane/peer_writer.h"

namespace wsync::cuda {
namespace {

constexpr char kMagic[8] = {'W', 'S', 'M', 'B', 'X', 'C', '0', '2'};
constexpr size_t kUuidOffset = 16;
constexpr size_t kUuidBytes = 64;
constexpr size_t kHandleOffset = kUuidOffset + kUuidBytes;
constexpr size_t kBytes = exec::PeerWriter::kMailboxDescriptorBytes;
constexpr size_t kProcessOffset = kHandleOffset + sizeof(cudaIpcMemHandle_t);
constexpr size_t kPointerOffset = kProcessOffset + 8;
static_assert(kPointerOffset + 8 <= kBytes, "descriptor too small");

// A random number per process: a descriptor of this process names memory it
// reaches without CUDA IPC (which refuses handles of its own process). Not
// the pid: processes of other PID namespaces may share it.
uint64_t ProcessNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  }();
  return nonce;
}

}  // namespace

absl::Status CudaMailboxes::EnablePeerAccessTo(const void* p, const std::string& what) {
  cudaPointerAttributes a{};
  if (const cudaError_t err = cudaPointerGetAttributes(&a, p); err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    return absl::InvalidArgumentError(absl::StrCat(what,
                                                   " names memory of this process that CUDA "
                                                   "does not know: ",
                                                   cudaGetErrorString(err)));
  }
  if (a.type != cudaMemoryTypeDevice || a.device == device_) return absl::OkStatus();
  const cudaError_t err = cudaDeviceEnablePeerAccess(a.device, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // not sticky: clear it
    return absl::OkStatus();
  }
  return CudaStatus(err, absl::StrCat("peer access from device ", device_, " to device ", a.device,
                                      " (", what, "'s mailbox)"));
}

absl::StatusOr<std::unique_ptr<CudaMailboxes>> CudaMailboxes::Create(int device) {
  std::unique_ptr<CudaMailboxes> m(new CudaMailboxes(device));
  ASSIGN_OR_RETURN(m->stream_, Stream::Create(device));
  ASSIGN_OR_RETURN(m->pinned_, PinnedBuffer::Allocate(24));
  uint64_t* words = static_cast<uint64_t*>(m->pinned_.data());
  words[2] = 0;
  void* mapped = nullptr;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&mapped, words + 2, 0),
                             absl::StrCat("mapping the gate counter for device ", device));
  m->timed_out_device_ = static_cast<unsigned long long*>(mapped);
  DeviceGuard guard(device);
  WSYNC_CUDA_RETURN_IF_ERROR(LoadGateKernels(),
                             absl::StrCat("loading the put gate kernels on device ", device));
  return m;
}

CudaMailboxes::~CudaMailboxes() {
  for (auto& [peer, box] : peers_) ClosePeer(box);
}

void CudaMailboxes::ClosePeer(PeerBox& box) {
  if (box.base == nullptr || !box.ipc) return;
  DeviceGuard guard(device_);
  const cudaError_t err = cudaIpcCloseMemHandle(box.base);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    spdlog::error("wsync mailbox: cudaIpcCloseMemHandle: {}", cudaGetErrorString(err));
  }
  box.base = nullptr;
}

absl::StatusOr<std::string> CudaMailboxes::CreateMailbox(int64_t slots) {
  if (slots < 1 || slots > exec::PeerWriter::kMaxMailboxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("a mailbox of ", slots, " slots (1 to ",
                                                   exec::PeerWriter::kMaxMailboxSlots, ")"));
  }
  const size_t bytes = static_cast<size_t>(slots) * 8;
  own_.Reset();
  own_slots_ = 0;
  ASSIGN_OR_RETURN(own_, DeviceBuffer::Allocate(device_, bytes));
  DeviceGuard guard(device_);
  WSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(own_.data(), 0, bytes, stream_.get()),
                             absl::StrCat("zeroing the mailbox on device ", device_));
  RETURN_IF_ERROR(stream_.Synchronize());
  cudaIpcMemHandle_t handle;
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaIpcGetMemHandle(&handle, own_.data()),
      absl::StrCat("cudaIpcGetMemHandle of the mailbox on device ", device_));
  ASSIGN_OR_RETURN(const std::string uuid, DeviceUuid(device_));
  std::string d(kBytes, '\0');
  std::memcpy(d.data(), kMagic, sizeof(kMagic));
  const uint64_t n = static_cast<uint64_t>(slots);
  for (int b = 0; b < 8; ++b) d[8 + b] = static_cast<char>((n >> (8 * b)) & 0xff);
  std::memcpy(d.data() + kUuidOffset, uuid.data(), std::min(uuid.size(), kUuidBytes - 1));
  std::memcpy(d.data() + kHandleOffset, &handle, sizeof(handle));
  const uint64_t nonce = ProcessNonce();
  const uint64_t ptr = reinterpret_cast<uintptr_t>(own_.data());
  std::memcpy(d.data() + kProcessOffset, &nonce, 8);
  std::memcpy(d.data() + kPointerOffset, &ptr, 8);
  own_slots_ = slots;
  return d;
}

absl::Status CudaMailboxes::OpenPeer(int32_t peer, const std::string& descriptor) {
  const std::string what = absl::StrCat("worker ", peer, "'s mailbox descriptor");
  if (descriptor.size() != kBytes || std::memcmp(descriptor.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is malformed (", descriptor.size(), " bytes, expected ", kBytes,
        " starting with WSMBXC02; 01 is the layout of four slots per peer before session 24)"));
  }
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t{static_cast<uint8_t>(descriptor[8 + b])} << (8 * b);
  if (n < 1 || n > static_cast<uint64_t>(exec::PeerWriter::kMaxMailboxSlots)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " declares ", n, " slots (1 to ",
                                                   exec::PeerWriter::kMaxMailboxSlots, ")"));
  }
  const char* uuid_begin = descriptor.data() + kUuidOffset;
  const void* nul = std::memchr(uuid_begin, '\0', kUuidBytes);
  if (nul == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": its GPU UUID is not terminated"));
  }
  const std::string uuid(uuid_begin, static_cast<const char*>(nul) - uuid_begin);
  uint64_t nonce = 0, ptr = 0;
  std::memcpy(&nonce, descriptor.data() + kProcessOffset, 8);
  std::memcpy(&ptr, descriptor.data() + kPointerOffset, 8);
  DeviceGuard guard(device_);
  PeerBox box{nullptr, static_cast<int64_t>(n), true};
  if (nonce == ProcessNonce()) {
    // A peer of this process (workers as threads): its memory is reachable
    // as is (posts copy with cudaMemcpyDefault); the gate kernels store
    // into it, which on another GPU needs peer access.
    box.base = reinterpret_cast<void*>(ptr);
    box.ipc = false;
    RETURN_IF_ERROR(EnablePeerAccessTo(box.base, what));
  } else {
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, descriptor.data() + kHandleOffset, sizeof(handle));
    WSYNC_CUDA_RETURN_IF_ERROR(
        cudaIpcOpenMemHandle(&box.base, handle, cudaIpcMemLazyEnablePeerAccess),
        absl::StrCat("opening ", what, " (its mailbox on GPU ", uuid, ") on device ", device_));
  }
  // The peer's claimed slot count bounds the posts: check it against the
  // allocation mapped, or a wrong claim would let a post write past it.
  auto api = GetDriverApi();
  CUdeviceptr mapped_base = 0;
  size_t mapped_bytes = 0;
  absl::Status size_ok =
      api.ok() ? CuStatus((*api)->cuMemGetAddressRange(&mapped_base, &mapped_bytes,
                                                       reinterpret_cast<CUdeviceptr>(box.base)),
                          absl::StrCat("size of ", what, "'s mailbox"))
               : api.status();
  if (size_ok.ok() &&
      (mapped_base != reinterpret_cast<CUdeviceptr>(box.base) || mapped_bytes < n * 8)) {
    size_ok = absl::InvalidArgumentError(absl::StrCat(
        what, " declares ", n, " slots but the mapped allocation has ", mapped_bytes, " bytes"));
  }
  if (!size_ok.ok()) {
    ClosePeer(box);
    return size_ok;
  }
  auto it = peers_.find(peer);
  if (it != peers_.end()) ClosePeer(it->second);
  peers_[peer] = box;
  return absl::OkStatus();
}

absl::Status CudaMailboxes::Post(int32_t peer, int64_t slot, uint64_t value) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("posting to worker ", peer, ": its mailbox was not opened"));
  }
  if (slot < 0 || slot >= it->second.slots) {
    return absl::OutOfRangeError(absl::StrCat("posting to worker ", peer, ": slot ", slot,
                                              " outside its mailbox of ", it->second.slots));
  }
  DeviceGuard guard(device_);
  uint64_t* src = static_cast<uint64_t*>(pinned_.data());
  *src = value;
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(static_cast<uint64_t*>(it->second.base) + slot, src, 8, cudaMemcpyDefault,
                      stream_.get()),
      absl::StrCat("posting to worker ", peer, "'s mailbox from device ", device_));
  return stream_.Synchronize();
}

absl::StatusOr<uint64_t> CudaMailboxes::Read(int64_t slot) {
  if (own_slots_ == 0) {
    return absl::FailedPreconditionError("reading this writer's mailbox: none was created");
  }
  if (slot < 0 || slot >= own_slots_) {
    return absl::OutOfRangeError(
        absl::StrCat("reading slot ", slot, " outside this writer's mailbox of ", own_slots_));
  }
  DeviceGuard guard(device_);
  uint64_t* dst = static_cast<uint64_t*>(pinned_.data()) + 1;
  WSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, static_cast<const uint64_t*>(own_.data()) + slot,
                                             8, cudaMemcpyDeviceToHost, stream_.get()),
                             absl::StrCat("reading the mailbox on device ", device_));
  RETURN_IF_ERROR(stream_.Synchronize());
  return *dst;
}

absl::Status CudaMailboxes::SignalOn(cudaStream_t stream,
                                     absl::Span<const exec::PeerWriter::GatePost> posts) {
  std::vector<GateSignalArgs> launches;
  for (size_t i = 0; i < posts.size(); ++i) {
    const exec::PeerWriter::GatePost& p = posts[i];
    auto it = peers_.find(p.peer);
    if (it == peers_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("a put gate's signal to worker ", p.peer, ": its mailbox was not opened"));
    }
    if (p.slot < 0 || p.slot >= it->second.slots) {
      return absl::OutOfRangeError(absl::StrCat("a put gate's signal to worker ", p.peer, ": slot ",
                                                p.slot, " outside its mailbox of ",
                                                it->second.slots));
    }
    if (i % kMaxGateSlots == 0) launches.emplace_back();
    GateSignalArgs& a = launches.back();
    a.slot[a.count] = static_cast<unsigned long long*>(it->second.base) + p.slot;
    a.value[a.count] = p.value;
    ++a.count;
  }
  DeviceGuard guard(device_);
  for (const GateSignalArgs& a : launches) {
    WSYNC_CUDA_RETURN_IF_ERROR(LaunchGateSignal(a, stream),
                               absl::StrCat("a put gate's signal from device ", device_));
  }
  return absl::OkStatus();
}

absl::Status CudaMailboxes::WaitOn(cudaStream_t stream,
                                   absl::Span<const exec::PeerWriter::GateWait> waits,
                                   absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a put gate's timeout must be positive, not ", absl::FormatDuration(timeout)));
  }
  std::vector<GateWaitArgs> launches;
  for (size_t i = 0; i < waits.size(); ++i) {
    const exec::PeerWriter::GateWait& w = waits[i];
    if (w.slot < 0 || w.slot >= own_slots_) {
      return absl::OutOfRangeError(absl::StrCat("a put gate on slot ", w.slot,
                                                " outside this writer's mailbox of ", own_slots_));
    }
    if (i % kMaxGateSlots == 0) {
      launches.emplace_back();
      launches.back().timeout_ns = absl::ToInt64Nanoseconds(timeout);
      launches.back().timed_out = timed_out_device_;
    }
    GateWaitArgs& a = launches.back();
    a.slot[a.count] = static_cast<const unsigned long long*>(own_.data()) + w.slot;
    a.at_least[a.count] = w.at_least;
    ++a.count;
  }
  DeviceGuard guard(device_);
  for (const GateWaitArgs& a : launches) {
    WSYNC_CUDA_RETURN_IF_ERROR(LaunchGateWait(a, stream),
                               absl::StrCat("a put gate on device ", device_));
  }
  return absl::OkStatus();
}

int64_t CudaMailboxes::gates_timed_out() const {
  return static_cast<int64_t>(reinterpret_cast<const volatile uint64_t*>(pinned_.data())[2]);
}

}  // namespace wsync::cuda
