// Gloo reports failures with C++ exceptions; they stay inside this file.
#include "worker/backends/host/gloo_mesh.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"

namespace wsync::transport {
namespace {

constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

// Gloo waits up to 5x a pair's timeout for its initial connect (tcp/pair.h,
// waitUntil): a fifth of the time left bounds that wait by the deadline.
std::chrono::milliseconds PairTimeout(absl::Time deadline) {
  const absl::Duration left =
      std::clamp(deadline - absl::Now(), absl::Milliseconds(5), absl::Hours(24));
  return std::chrono::milliseconds(
      absl::ToInt64Milliseconds(absl::Ceil(left / 5, absl::Milliseconds(1))));
}

std::string AddressKey(const std::string& prefix, int from, int to) {
  return absl::StrCat(prefix, "/addr/", from, "/", to);
}

// What the connector thread reports; shared because the thread may outlive
// ConnectMesh (see there).
struct ConnectState {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  int connecting ABSL_GUARDED_BY(mu) = -1;  // the peer whose pair is connecting
  absl::Status status ABSL_GUARDED_BY(mu);
};

// Connects every pair of `context` in rank order (as every rank does).
void ConnectPairs(std::shared_ptr<gloo::transport::Context> context,
                  std::vector<std::vector<char>> addresses, std::shared_ptr<ConnectState> state) {
  absl::Status status;
  for (int peer = 0; peer < context->size; ++peer) {
    if (peer == context->rank) continue;
    {
      absl::MutexLock lock(&state->mu);
      state->connecting = peer;
    }
    try {
      context->getPair(peer)->connect(addresses[peer]);
    } catch (const std::exception& e) {
      status = absl::UnavailableError(
          absl::StrCat("connecting to peer rank ", peer, " failed: ", e.what()));
      break;
    }
  }
  absl::MutexLock lock(&state->mu);
  state->status = std::move(status);
  state->done = true;
}

}  // namespace

absl::Status MeshContext::ConnectMesh(std::shared_ptr<gloo::transport::Device> device,
                                      const MeshConnectOptions& options) {
  const std::string who =
      absl::StrCat("gloo connect of rank ", rank, "/", size, " (prefix '", options.prefix, "')");
  std::shared_ptr<gloo::transport::Context> context;
  try {
    context = device->createContext(rank, size);
    context->setTimeout(PairTimeout(options.deadline));
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) context->createPair(peer);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(who, ": creating the pairs: ", e.what()));
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> bytes = context->getPair(peer)->address().bytes();
    absl::Status s = options.store->Set(AddressKey(options.prefix, rank, peer),
                                        std::string(bytes.begin(), bytes.end()));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(who, ": publishing its address for peer rank ",
                                                 peer, ": ", s.message()));
    }
  }
  // Every peer's addresses first (each rank publishes all of its own before
  // it connects any pair): the store calls end by the deadline or abort.
  std::vector<std::vector<char>> addresses(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    absl::StatusOr<std::string> address =
        options.store->Get(AddressKey(options.prefix, peer, rank), options.deadline);
    if (!address.ok()) {
      return absl::Status(address.status().code(),
                          absl::StrCat(who, ": peer rank ", peer, " did not publish its address: ",
                                       address.status().message()));
    }
    addresses[peer].assign(address->begin(), address->end());
  }
  // Gloo's connect can be woken only by closing the pair, which resets the
  // TCP connection (SO_LINGER 0), and a peer whose device thread then
  // accepts the reset connection aborts (getpeername in Gloo's accept path
  // throws on its loop thread). So the pairs connect on a thread of their
  // own that owns the context: past the deadline or on an abort this call
  // returns, and the thread ends within its pairs' timeouts (a fifth of the
  // time left each, so one pair by the deadline), closing them gently.
  auto state = std::make_shared<ConnectState>();
  std::thread(ConnectPairs, context, std::move(addresses), state).detach();
  absl::MutexLock lock(&state->mu);
  while (!state->done) {
    const bool aborted = options.cancel != nullptr && options.cancel->load();
    if (aborted || absl::Now() >= options.deadline) {
      return absl::Status(
          aborted ? absl::StatusCode::kCancelled : absl::StatusCode::kDeadlineExceeded,
          absl::StrCat(who, ": connecting to peer rank ", state->connecting, " did not finish: ",
                       aborted ? "the sync was aborted" : "the sync's deadline passed"));
    }
    state->mu.AwaitWithDeadline(absl::Condition(&state->done),
                                std::min(options.deadline, absl::Now() + kCancelPoll));
  }
  if (!state->status.ok()) {
    return absl::Status(state->status.code(), absl::StrCat(who, ": ", state->status.message()));
  }
  context->setTimeout(PairTimeout(options.deadline) * 5);
  device_ = std::move(device);
  transportContext_ = std::move(context);
  return absl::OkStatus();
}

}  // namespace wsync::transport
