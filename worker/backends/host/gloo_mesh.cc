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

// Fails every pair of `context` (waking any thread blocked connecting one)
// once the deadline passes or `cancel` is set, until Stop().
class ConnectWatchdog {
 public:
  ConnectWatchdog(gloo::transport::Context* context, absl::Time deadline,
                  const std::atomic<bool>* cancel)
      : context_(context), deadline_(deadline), cancel_(cancel), thread_([this] { Run(); }) {}
  ~ConnectWatchdog() { Stop().IgnoreError(); }

  // Why it fired, or OK (still watching).
  absl::Status Fired() {
    absl::MutexLock lock(&mu_);
    return fired_;
  }

  // Ends the watch (joins). Returns why it fired, or OK.
  absl::Status Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return fired_;
  }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stopped_) {
      const absl::Time wake = std::min(deadline_, absl::Now() + kCancelPoll);
      mu_.AwaitWithDeadline(absl::Condition(&stopped_), wake);
      if (stopped_) return;
      if (cancel_ != nullptr && cancel_->load()) {
        Fire(absl::CancelledError("the sync was aborted"));
        return;
      }
      if (absl::Now() >= deadline_) {
        Fire(absl::DeadlineExceededError("the sync's deadline passed"));
        return;
      }
    }
  }

  // Closing a pair wakes a thread waiting in its connect() (it returns as
  // if connected; ConnectMesh then checks Fired()); connect() on a closed
  // pair returns or throws at once.
  void Fire(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    fired_ = std::move(why);
    for (int peer = 0; peer < context_->size; ++peer) {
      if (peer == context_->rank) continue;
      try {
        auto& pair = context_->getPair(peer);
        if (pair) pair->close();
      } catch (const std::exception&) {
        // Already failed: closed is what we want.
      }
    }
  }

  gloo::transport::Context* const context_;
  const absl::Time deadline_;
  const std::atomic<bool>* const cancel_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fired_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the members it reads
};

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
  ConnectWatchdog watchdog(context.get(), options.deadline, options.cancel);
  auto failed = [&](int peer, const absl::Status& why, const std::string& how) {
    return absl::Status(why.code(), absl::StrCat(who, ": connecting to peer rank ", peer, " ", how,
                                                 ": ", why.message()));
  };
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    absl::StatusOr<std::string> address =
        options.store->Get(AddressKey(options.prefix, peer, rank), options.deadline);
    if (!address.ok()) {
      return absl::Status(address.status().code(),
                          absl::StrCat(who, ": peer rank ", peer, " did not publish its address: ",
                                       address.status().message()));
    }
    if (absl::Status fired = watchdog.Fired(); !fired.ok()) {
      return failed(peer, fired, "did not start");
    }
    try {
      context->getPair(peer)->connect(std::vector<char>(address->begin(), address->end()));
    } catch (const std::exception& e) {
      const absl::Status fired = watchdog.Stop();
      return failed(peer, fired.ok() ? absl::UnavailableError(e.what()) : fired, "failed");
    }
    if (absl::Status fired = watchdog.Fired(); !fired.ok()) {
      return failed(peer, fired, "did not finish");
    }
  }
  if (absl::Status fired = watchdog.Stop(); !fired.ok()) {
    return absl::Status(fired.code(),
                        absl::StrCat(who, ": ", fired.message(), " as the last pair connected"));
  }
  context->setTimeout(PairTimeout(options.deadline) * 5);
  device_ = std::move(device);
  transportContext_ = std::move(context);
  return absl::OkStatus();
}

}  // namespace wsync::transport
