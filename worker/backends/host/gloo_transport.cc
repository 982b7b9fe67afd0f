// Gloo reports failures with C++ exceptions; they are caught at this file's
// boundary and turned into absl::Status (the rest of wsync has none).
#include "worker/backends/host/gloo_transport.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/backends/host/gloo_mesh.h"

namespace wsync::transport {
namespace {

std::chrono::milliseconds Remaining(absl::Time deadline) {
  // Gloo treats -1 ms as "use the context default"; never pass a negative.
  const absl::Duration left =
      std::clamp(deadline - absl::Now(), absl::ZeroDuration(), absl::Hours(24 * 30));
  return std::chrono::milliseconds(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
}

struct Pending {
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  bool is_send;
  int32_t peer;
  int64_t tag;
  size_t bytes;
  size_t index = 0;  // in the round's sends or recvs
  int32_t step = 0;
  bool posted = false;  // a later step's are posted once the earlier ones completed
  bool done = false;
};

std::string Describe(const Pending& p) {
  return absl::StrCat(p.is_send ? "send to" : "recv from", " peer ", p.peer, " (tag ", p.tag, ", ",
                      p.bytes, " B", p.step > 0 ? absl::StrCat(", step ", p.step) : "", ")");
}

std::string PendingSummary(const std::vector<Pending>& ops) {
  std::set<int32_t> peers;
  std::vector<std::string> first;
  for (const Pending& p : ops) {
    if (p.done || !p.posted) continue;
    peers.insert(p.peer);
    if (first.size() < 8) first.push_back(Describe(p));
  }
  return absl::StrCat("pending peers [", absl::StrJoin(peers, ","),
                      "]: ", absl::StrJoin(first, "; "), first.size() < 8 ? "" : "; ...");
}

// Posts and waits for `ops` (built and in flight) step by step: a step's
// operations are posted once every earlier one completed. on_posted runs once
// the first step is posted. Receives are waited for first within a step, in
// request order, each but the round's last reported landed (in host memory
// already: a null mark) once it and those before it completed. False when a
// wait was aborted; throws what Gloo throws.
bool PostAndWaitSteps(std::vector<Pending>& ops, absl::Time deadline, const RoundHooks& hooks) {
  size_t last_recv = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].is_send) last_recv = i;
  }
  for (size_t b = 0; b < ops.size();) {
    size_t e = b;
    while (e < ops.size() && ops[e].step == ops[b].step) ++e;
    for (size_t i = b; i < e; ++i) {
      Pending& p = ops[i];
      const uint64_t slot = static_cast<uint64_t>(p.tag);
      if (p.is_send) {
        p.buffer->send(p.peer, slot, 0, p.bytes);
      } else {
        p.buffer->recv(p.peer, slot, 0, p.bytes);
      }
      p.posted = true;
    }
    if (b == 0 && hooks.on_posted) hooks.on_posted();
    for (size_t i = b; i < e; ++i) {
      Pending& p = ops[i];
      const bool ok = p.is_send ? p.buffer->waitSend(Remaining(deadline))
                                : p.buffer->waitRecv(Remaining(deadline));
      if (!ok) return false;
      p.done = true;
      if (!p.is_send && i != last_recv && hooks.on_landed) {
        const size_t index[] = {p.index};
        hooks.on_landed(index, LandingMark{});
      }
    }
    b = e;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooTransport>> GlooTransport::Create(
    const GlooTransportOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo transport: rank ", options.rank, " outside size ", options.size));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("gloo transport: no store");
  MeshConnectOptions mesh;
  mesh.store = options.store;
  mesh.prefix = options.prefix;
  mesh.deadline = std::min(options.deadline, absl::Now() + options.connect_timeout);
  mesh.cancel = options.cancel;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) {
      attr.iface = options.iface;
    } else {
      attr.hostname = options.hostname;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo transport rank ", options.rank,
                                               ": no TCP device for '", options.iface,
                                               options.hostname, "': ", e.what()));
  }
  auto context = std::make_shared<MeshContext>(options.rank, options.size);
  RETURN_IF_ERROR(context->ConnectMesh(std::move(device), mesh));
  return std::unique_ptr<GlooTransport>(
      new GlooTransport(options.rank, options.size, std::move(context)));
}

GlooTransport::GlooTransport(int32_t rank, int32_t size, std::shared_ptr<gloo::Context> context)
    : rank_(rank), size_(size), context_(std::move(context)) {}

GlooTransport::~GlooTransport() = default;

absl::Status GlooTransport::RunRound(absl::Span<const SendRequest> sends,
                                     absl::Span<const RecvRequest> recvs, absl::Time deadline,
                                     const RoundHooks& hooks) {
  RETURN_IF_ERROR(ValidateRoundRequests(rank_, size_, sends, recvs));
  std::vector<Pending> ops;
  ops.reserve(sends.size() + recvs.size());
  for (size_t i = 0; i < recvs.size(); ++i) {
    const RecvRequest& r = recvs[i];
    if (r.bytes > 0) ops.push_back(Pending{nullptr, false, r.peer, r.tag, r.bytes, i, r.step});
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    const SendRequest& r = sends[i];
    if (r.bytes > 0) ops.push_back(Pending{nullptr, true, r.peer, r.tag, r.bytes, i, r.step});
  }
  // Step by step; within a step receives first, each side in request order.
  std::stable_sort(ops.begin(), ops.end(),
                   [](const Pending& a, const Pending& b) { return a.step < b.step; });
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) {
      return absl::CancelledError(
          absl::StrCat("gloo transport rank ", rank_, ": ", broken_reason_));
    }
    if (!broken_reason_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("gloo transport rank ", rank_, " is unusable: ", broken_reason_));
    }
  }
  if (ops.empty()) {
    if (hooks.on_posted) hooks.on_posted();
    return absl::OkStatus();
  }

  // Builds buffers and posts every operation, then waits for each against the
  // one deadline. Any failure breaks the transport (pairs closed) before the
  // buffers go away, so nothing writes into caller memory afterwards.
  absl::Status status;
  try {
    for (Pending& p : ops) {
      void* data = p.is_send ? const_cast<void*>(sends[p.index].data) : recvs[p.index].data;
      p.buffer = context_->createUnboundBuffer(data, p.bytes);
    }
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) {
        status = absl::CancelledError(absl::StrCat("aborted: ", broken_reason_));
      } else {
        for (const Pending& p : ops) inflight_.push_back(p.buffer.get());
      }
    }
    if (status.ok() && !PostAndWaitSteps(ops, deadline, hooks)) {
      absl::MutexLock lock(&mu_);
      status = absl::CancelledError(absl::StrCat("gloo transport rank ", rank_, " aborted (",
                                                 broken_reason_, "); ", PendingSummary(ops)));
    }
  } catch (const std::exception& e) {
    const Pending* failed = nullptr;
    for (const Pending& p : ops) {
      if (!p.done) {
        failed = &p;
        break;
      }
    }
    if (absl::Now() >= deadline) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "gloo transport rank ", rank_, ": round deadline passed with ", PendingSummary(ops)));
    } else {
      status = absl::UnavailableError(absl::StrCat(
          "gloo transport rank ", rank_, ": ", failed ? Describe(*failed) : "operation",
          " failed (peer connection lost?): ", e.what(), "; ", PendingSummary(ops)));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    inflight_.clear();
  }
  if (!status.ok()) Break(std::string(status.message()));
  return status;
}

void GlooTransport::Break(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (broken_reason_.empty()) broken_reason_ = why;
  }
  for (int32_t peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    try {
      auto& pair = context_->getPair(peer);
      if (pair) pair->close();
    } catch (const std::exception&) {
      // Already failed: closed is what we want.
    }
  }
}

void GlooTransport::Abort(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!aborted_) {
    aborted_ = true;
    if (broken_reason_.empty()) broken_reason_ = absl::StrCat("aborted: ", reason);
  }
  for (gloo::transport::UnboundBuffer* b : inflight_) {
    b->abortWaitSend();
    b->abortWaitRecv();
  }
}

}  // namespace wsync::transport
