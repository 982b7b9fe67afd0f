#include "worker/backends/cuda/nccl_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/stream_marks.h"
#include "worker/plane/round_groups.h"

namespace wsync::transport {
namespace {

absl::Status NcclStatus(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(r));
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
      return absl::UnavailableError(msg);
    case ncclSystemError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// "peer 1 (send tag 4, recv tag 4), peer 3 (recv tag 9)": every peer a round
// waits on, for deadline and abort errors.
std::string PeerList(const std::vector<const SendRequest*>& sends,
                     const std::vector<const RecvRequest*>& recvs) {
  std::map<int32_t, std::vector<std::string>> by_peer;
  for (const auto* x : sends) by_peer[x->peer].push_back(absl::StrCat("send tag ", x->tag));
  for (const auto* x : recvs) by_peer[x->peer].push_back(absl::StrCat("recv tag ", x->tag));
  std::vector<std::string> parts;
  for (auto& [peer, what] : by_peer) {
    if (what.size() > 4) {
      const size_t n = what.size();
      what.resize(3);
      what.push_back(absl::StrCat("... ", n, " requests"));
    }
    parts.push_back(absl::StrCat("peer ", peer, " (", absl::StrJoin(what, ", "), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

template <typename Req>
void SortByPeerTag(std::vector<const Req*>& reqs) {
  std::sort(reqs.begin(), reqs.end(), [](const Req* a, const Req* b) {
    return a->peer != b->peer ? a->peer < b->peer : a->tag < b->tag;
  });
}

}  // namespace

NcclComm& NcclComm::operator=(NcclComm&& o) noexcept {
  if (this != &o) {
    Abort();
    comm_ = o.comm_;
    o.comm_ = nullptr;
  }
  return *this;
}

void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status NcclComm::Finalize(absl::Time deadline) {
  if (comm_ == nullptr) return absl::OkStatus();
  ncclResult_t r = ncclCommFinalize(comm_);
  ncclResult_t state = r;
  while (state == ncclInProgress && absl::Now() < deadline) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    if (state == ncclInProgress) std::this_thread::yield();
  }
  if (state != ncclSuccess) {
    Abort();
    return state == ncclInProgress
               ? absl::DeadlineExceededError("NCCL communicator finalize timed out; aborted")
               : NcclStatus(state, "ncclCommFinalize");
  }
  ncclCommDestroy(comm_);
  comm_ = nullptr;
  return absl::OkStatus();
}

std::string UniqueIdToBytes(const ncclUniqueId& id) {
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(const std::string& bytes) {
  ncclUniqueId id;
  if (bytes.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id has ", bytes.size(),
                                                   " bytes, expected ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

absl::StatusOr<ncclUniqueId> NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclStatus(r, "ncclGetUniqueId");
  return id;
}

namespace {
void ApplyProcessTuning(const NcclTransportOptions& opts) {
  if (opts.min_p2p_channels > 0) {
    setenv("NCCL_MIN_P2P_NCHANNELS", absl::StrCat(opts.min_p2p_channels).c_str(),
           /*overwrite=*/0);
  }
}
}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    const ncclUniqueId& id, const NcclTransportOptions& opts) {
  ApplyProcessTuning(opts);
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", opts.rank, " outside a communicator of ", opts.size));
  }
  std::unique_ptr<NcclTransport> t(new NcclTransport());
  t->device_ = opts.device;
  t->rank_ = opts.rank;
  t->cancel_ = opts.cancel;
  t->size_ = opts.size;
  // Highest priority: when SMs free up, NCCL's blocks are scheduled before
  // the data ops' pack / unpack / copy blocks.
  int least_priority = 0, greatest_priority = 0;
  cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority);
  auto stream = cuda::Stream::Create(opts.device, greatest_priority);
  if (!stream.ok()) return stream.status();
  t->stream_ = std::move(*stream);
  auto event = cuda::Event::Create(opts.device);
  if (!event.ok()) return event.status();
  t->done_ = std::move(*event);

  cuda::DeviceGuard guard(opts.device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, opts.size, id, opts.rank, &config);
  t->comm_ = NcclComm(comm);
  const std::string what = absl::StrCat("NCCL communicator init (rank ", opts.rank, " of ",
                                        opts.size, ", device ", opts.device, ")");
  if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, what);
  absl::Status s = t->Wait(absl::Now() + opts.init_timeout, nullptr, what);
  if (!s.ok()) {
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete within ",
                                                      absl::FormatDuration(opts.init_timeout),
                                                      ": some rank did not join"));
    }
    return s;
  }
  return t;
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    KvStore& store, const std::string& prefix, const NcclTransportOptions& opts) {
  ApplyProcessTuning(opts);
  const std::string key = absl::StrCat(prefix, "/nccl_unique_id");
  ncclUniqueId id;
  if (opts.rank == 0) {
    auto made = NewUniqueId();
    if (!made.ok()) return made.status();
    id = *made;
    if (absl::Status s = store.Set(key, UniqueIdToBytes(id)); !s.ok()) return s;
  } else {
    auto bytes = store.Get(key, absl::Now() + opts.init_timeout);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat("rank ", opts.rank, " waiting for rank 0's NCCL id: ",
                                       bytes.status().message()));
    }
    auto parsed = UniqueIdFromBytes(*bytes);
    if (!parsed.ok()) return parsed.status();
    id = *parsed;
  }
  return Create(id, opts);
}

NcclTransport::~NcclTransport() {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_.get() == nullptr) return;
  cuda::DeviceGuard guard(device_);
  absl::Status s = comm_.Finalize(absl::Now() + absl::Seconds(10));
  if (!s.ok()) spdlog::error("wsync nccl: {}", std::string(s.message()));
}

void NcclTransport::AbortLocked(const std::string& why) {
  comm_.Abort();
  aborted_ = true;
  std::lock_guard<std::mutex> lock(reason_mu_);
  if (abort_reason_.empty()) abort_reason_ = why;
}

void NcclTransport::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  abort_requested_ = true;
  // If no round is in flight, tear down now; otherwise the polling loop does.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) {
    cuda::DeviceGuard guard(device_);
    AbortLocked(reason);
  }
}

absl::Status NcclTransport::Wait(absl::Time deadline, const cuda::Event* event,
                                 const std::string& what, const std::function<void()>& on_issued) {
  bool issued = false;  // the group has left ncclInProgress
  for (uint64_t spin = 0;; ++spin) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_.get(), &state);
    if (q != ncclSuccess) state = q;
    if (state != ncclSuccess && state != ncclInProgress) {
      const absl::Status err = NcclStatus(state, what);
      AbortLocked(std::string(err.message()));
      return err;
    }
    if (state == ncclSuccess && !issued) {
      issued = true;
      if (event == nullptr) {
        if (on_issued) on_issued();
        return absl::OkStatus();
      }
      // Nonblocking groups enqueue their kernels only once the communicator
      // leaves ncclInProgress: record completion after that point.
      if (absl::Status s = event->Record(stream_.get()); !s.ok()) {
        // The group is posted: end it, or it would outlive the round.
        AbortLocked(std::string(s.message()));
        return s;
      }
      cuda::StreamMark("nccl", stream_.get());
      if (on_issued) on_issued();
    }
    if (issued) {
      auto done = event->Query();
      if (!done.ok()) {
        AbortLocked(std::string(done.status().message()));
        return done.status();
      }
      if (*done) return absl::OkStatus();
    }
    if (cancel_ != nullptr && cancel_->load() && !abort_requested_.load()) {
      {
        std::lock_guard<std::mutex> lock(reason_mu_);
        if (abort_reason_.empty()) abort_reason_ = "the worker aborted the sync";
      }
      abort_requested_ = true;  // handled just below, on this thread
    }
    if (abort_requested_.load()) {
      std::string reason;
      {
        std::lock_guard<std::mutex> lock(reason_mu_);
        reason = abort_reason_;
      }
      AbortLocked(reason);
      return absl::CancelledError(absl::StrCat(what, " aborted: ", reason));
    }
    // The clock is read every 64 polls: a poll is ~1 us, deadlines are seconds.
    if ((spin & 63) == 0 && absl::Now() > deadline) {
      AbortLocked(absl::StrCat(what, ": deadline exceeded"));
      return absl::DeadlineExceededError(
          absl::StrCat(what, " not complete at its deadline; communicator aborted"));
    }
    if (spin > 4096) std::this_thread::yield();
  }
}

absl::Status NcclTransport::PostGroup(const std::vector<const SendRequest*>& s,
                                      const std::vector<const RecvRequest*>& r,
                                      const std::string& what) {
  ncclResult_t res = ncclGroupStart();
  // Sends and receives interleaved by peer; per pair NCCL matches in order.
  size_t i = 0, j = 0;
  while (res == ncclSuccess && (i < s.size() || j < r.size())) {
    const bool take_send = j >= r.size() || (i < s.size() && s[i]->peer <= r[j]->peer);
    if (take_send) {
      res = ncclSend(s[i]->data, s[i]->bytes, ncclUint8, s[i]->peer, comm_.get(), stream_.get());
      ++i;
    } else {
      res = ncclRecv(r[j]->data, r[j]->bytes, ncclUint8, r[j]->peer, comm_.get(), stream_.get());
      ++j;
    }
    if (res == ncclInProgress) res = ncclSuccess;
  }
  const ncclResult_t end = ncclGroupEnd();
  for (const ncclResult_t x : {res, end}) {
    if (x != ncclSuccess && x != ncclInProgress) {
      const absl::Status err = NcclStatus(x, what);
      AbortLocked(std::string(err.message()));
      return err;
    }
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::RunRound(absl::Span<const SendRequest> sends,
                                     absl::Span<const RecvRequest> recvs, absl::Time deadline,
                                     const RoundHooks& hooks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.load() || comm_.get() == nullptr || abort_requested_.load()) {
    std::lock_guard<std::mutex> rl(reason_mu_);
    const std::string msg = absl::StrCat("NCCL transport of rank ", rank_, " is unusable (",
                                         abort_reason_, "); rebuild it");
    return abort_requested_.load() ? absl::CancelledError(msg) : absl::FailedPreconditionError(msg);
  }
  if (absl::Status st = ValidateRoundRequests(rank_, size_, sends, recvs); !st.ok()) return st;
  std::vector<const SendRequest*> s;
  std::vector<const RecvRequest*> r;
  s.reserve(sends.size());
  r.reserve(recvs.size());
  for (const auto& x : sends) {
    if (x.bytes > 0) s.push_back(&x);
  }
  for (const auto& x : recvs) {
    if (x.bytes > 0) r.push_back(&x);
  }
  if (s.empty() && r.empty()) {
    if (hooks.on_posted) hooks.on_posted();
    return absl::OkStatus();
  }
  SortByPeerTag(s);
  SortByPeerTag(r);
  const std::vector<RoundGroup> steps = CutRoundIntoGroups(s, r, hooks);

  cuda::DeviceGuard guard(device_);
  const std::string what =
      absl::StrCat("NCCL round on rank ", rank_, " waiting on ", PeerList(s, r));
  // Every step but the last is issued and marked by its own event; the last
  // one is followed by done_, recorded by Wait once it is issued.
  while (part_events_.size() + 1 < steps.size()) {
    auto ev = cuda::Event::Create(device_);
    if (!ev.ok()) return ev.status();
    part_events_.push_back(std::move(*ev));
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    RETURN_IF_ERROR(PostGroup(steps[k].sends, steps[k].recvs, what));
    if (k + 1 == steps.size()) break;
    RETURN_IF_ERROR(Wait(deadline, nullptr, what));
    if (absl::Status st = part_events_[k].Record(stream_.get()); !st.ok()) {
      AbortLocked(std::string(st.message()));
      return st;
    }
  }
  auto issued = [&] {
    if (hooks.on_posted) hooks.on_posted();
    if (!hooks.on_landed) return;
    // The last part lands with the round: never named (transport.h).
    std::vector<size_t> landed;
    for (size_t k = 0; k + 1 < steps.size(); ++k) {
      landed.clear();
      for (const RecvRequest* x : steps[k].recvs) landed.push_back(x - recvs.data());
      if (!landed.empty()) hooks.on_landed(landed, LandingMark{part_events_[k].get()});
    }
  };
  return Wait(deadline, &done_, what, issued);
}

}  // namespace wsync::transport
