// gRPC callback reactors whose answer a WaitHub poll decides (wait_hub.h):
// the controller's waits and watchers hold no thread while they wait.
// Each reactor deletes itself in OnDone (gRPC's callback-API ownership: the
// library calls OnDone last, once).
#ifndef WSYNC_CONTROLLER_SERVER_POLLED_REACTORS_H_
#define WSYNC_CONTROLLER_SERVER_POLLED_REACTORS_H_

#include <atomic>
#include <functional>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/wire_text.h"
#include "controller/server/wait_hub.h"
#include "grpcpp/grpcpp.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// `s` for a gRPC client, its message clipped to kMaxWireMessageBytes
// (common/wire_text.h): a message that echoes a huge request field must not
// outgrow the client's metadata limit.
inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), ClipForWire(s.message()));
}

// A unary call answered at once with `status`.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& status);

// A server stream of SyncStatus that ends at once with `status` (a refused
// caller), writing nothing.
grpc::ServerWriteReactor<v1::SyncStatus>* RefuseWatch(const grpc::Status& status);
// The same for a worker's assignment stream.
grpc::ServerWriteReactor<v1::Assignment>* RefuseAssignments(const grpc::Status& status);

// A unary wait. `poll(expired)` fills the response and returns the call's
// status once the wait is over (always when `expired`), nullopt to keep
// waiting. It runs once in the handler, then on the hub's thread after each
// notification, at `deadline` and when the client goes away (then the call
// ends CANCELLED without it).
class PolledUnary final : public grpc::ServerUnaryReactor, public WaitHub::Waiter {
 public:
  using PollFn = std::function<std::optional<grpc::Status>(bool expired)>;
  static grpc::ServerUnaryReactor* Start(WaitHub* hub, absl::Time deadline, PollFn poll);

  bool Poll(bool expired) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  PolledUnary(WaitHub* hub, PollFn poll) : hub_(hub), poll_(std::move(poll)) {}

  WaitHub* const hub_;
  const PollFn poll_;
  std::atomic<uint64_t> id_{0};
  std::atomic<bool> cancelled_{false};
};

// A server stream of SyncStatus: `next(&seen)` is the sync's status and
// change count (SyncCoordinator::NextSyncUpdate without waiting); a changed
// status is written, the final one ends the stream.
class PolledSyncWatch final : public grpc::ServerWriteReactor<v1::SyncStatus>,
                              public WaitHub::Waiter {
 public:
  using NextFn = std::function<absl::StatusOr<v1::SyncStatus>(int64_t* seen)>;
  static grpc::ServerWriteReactor<v1::SyncStatus>* Start(WaitHub* hub, NextFn next);

  bool Poll(bool expired) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  PolledSyncWatch(WaitHub* hub, NextFn next) : hub_(hub), next_(std::move(next)) {}

  WaitHub* const hub_;
  const NextFn next_;
  std::atomic<uint64_t> id_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> writing_{false};
  int64_t seen_ = -1;   // hub thread only
  v1::SyncStatus out_;  // the write in flight
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_POLLED_REACTORS_H_
