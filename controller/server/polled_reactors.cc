#include "controller/server/polled_reactors.h"

#include <memory>

namespace wsync::controller {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(status);
  return r;
}

namespace {
template <typename T>
class RefusedStream final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }  // NOLINT: callback-API ownership
};
}  // namespace

grpc::ServerWriteReactor<v1::SyncStatus>* RefuseWatch(const grpc::Status& status) {
  return new RefusedStream<v1::SyncStatus>(status);  // OnDone deletes it
}

grpc::ServerWriteReactor<v1::Assignment>* RefuseAssignments(const grpc::Status& status) {
  return new RefusedStream<v1::Assignment>(status);  // OnDone deletes it
}

grpc::ServerUnaryReactor* PolledUnary::Start(WaitHub* hub, absl::Time deadline, PollFn poll) {
  // Owned by gRPC from here: OnDone deletes it.
  auto reactor = std::unique_ptr<PolledUnary>(new PolledUnary(hub, std::move(poll)));
  if (std::optional<grpc::Status> now = reactor->poll_(/*expired=*/false)) {
    reactor->Finish(*now);
    return reactor.release();
  }
  absl::StatusOr<uint64_t> id = hub->Add(reactor.get(), deadline);
  if (!id.ok()) {
    reactor->Finish(ToGrpc(id.status()));
    return reactor.release();
  }
  reactor->id_.store(*id);
  return reactor.release();
}

bool PolledUnary::Poll(bool expired) {
  if (cancelled_.load()) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    return true;
  }
  std::optional<grpc::Status> done = poll_(expired);
  if (!done.has_value()) return false;
  Finish(*done);
  return true;
}

void PolledUnary::OnCancel() {
  cancelled_.store(true);
  hub_->Wake(id_.load());
}

void PolledUnary::OnDone() { delete this; }  // NOLINT: callback-API ownership

grpc::ServerWriteReactor<v1::SyncStatus>* PolledSyncWatch::Start(WaitHub* hub, NextFn next) {
  auto reactor = std::unique_ptr<PolledSyncWatch>(new PolledSyncWatch(hub, std::move(next)));
  absl::StatusOr<uint64_t> id = hub->Add(reactor.get(), absl::InfiniteFuture());
  if (!id.ok()) {
    reactor->Finish(ToGrpc(id.status()));
    return reactor.release();
  }
  reactor->id_.store(*id);
  return reactor.release();
}

bool PolledSyncWatch::Poll(bool expired) {
  if (writing_.load()) return false;  // OnWriteDone polls again
  if (cancelled_.load()) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away"));
    return true;
  }
  const int64_t before = seen_;
  absl::StatusOr<v1::SyncStatus> status = next_(&seen_);
  if (!status.ok()) {
    Finish(ToGrpc(status.status()));
    return true;
  }
  if (status->phase() != v1::SYNC_RUNNING) {
    out_ = *std::move(status);
    writing_.store(true);
    StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
    return true;
  }
  if (expired) {  // only at shutdown: watchers have no deadline of their own
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "controller is shutting down"));
    return true;
  }
  if (seen_ != before) {
    out_ = *std::move(status);
    writing_.store(true);
    StartWrite(&out_);
  }
  return false;
}

void PolledSyncWatch::OnWriteDone(bool ok) {
  if (!ok) cancelled_.store(true);
  writing_.store(false);
  hub_->Wake(id_.load());
}

void PolledSyncWatch::OnCancel() {
  cancelled_.store(true);
  hub_->Wake(id_.load());
}

void PolledSyncWatch::OnDone() { delete this; }  // NOLINT: callback-API ownership

}  // namespace wsync::controller
