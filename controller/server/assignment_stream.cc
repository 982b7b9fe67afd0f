#include "controller/server/assignment_stream.h"

#include <optional>
#include <utility>

#include "controller/server/polled_reactors.h"

namespace wsync::controller {

AssignmentStream::AssignmentStream(WorkerRegistry* workers, std::string lease_id)
    : feed_(workers, std::move(lease_id)), link_(std::make_shared<Link>()) {}

grpc::ServerWriteReactor<v1::Assignment>* AssignmentStream::Start(WorkerRegistry* workers,
                                                                  const std::string& lease_id) {
  // Owned by gRPC from here: OnDone deletes it (see Lifetime).
  auto stream = std::unique_ptr<AssignmentStream>(new AssignmentStream(workers, lease_id));
  {
    absl::MutexLock lock(&stream->link_->mu);
    stream->link_->stream = stream.get();
  }
  std::shared_ptr<Link> link = stream->link_;
  absl::Status opened = stream->feed_.Open([link] { Enter(link); });
  AssignmentStream* s = stream.release();
  if (!opened.ok()) {
    {
      absl::MutexLock lock(&s->mu_);
      s->finished_ = true;
    }
    s->Finish(ToGrpc(opened));
    return s;
  }
  // Headers now, so that the worker knows the stream is established.
  s->StartSendInitialMetadata();
  Enter(link);  // an assignment pushed before the token was set
  return s;
}

void AssignmentStream::Enter(const std::shared_ptr<Link>& link) {
  AssignmentStream* stream;
  {
    absl::MutexLock lock(&link->mu);
    stream = link->stream;
    if (stream == nullptr) return;
    ++link->active;
  }
  stream->Pump();
  bool last = false;
  {
    absl::MutexLock lock(&link->mu);
    --link->active;
    if (link->done && link->active == 0 && link->stream != nullptr) {
      link->stream = nullptr;
      last = true;
    }
  }
  if (last) delete stream;  // NOLINT: callback-API ownership (OnDone ran meanwhile)
}

void AssignmentStream::Pump() {
  std::optional<grpc::Status> end;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || writing_) return;
    if (write_failed_) {
      end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
    } else if (cancelled_.load()) {
      end = grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled");
    } else {
      absl::Status ended;
      switch (feed_.Next(&out_, &ended)) {
        case AssignmentFeed::Step::kNothing:  // also before the feed opened
          return;
        case AssignmentFeed::Step::kEnd:
          end = ToGrpc(ended);
          break;
        case AssignmentFeed::Step::kAssignment:
          writing_ = true;
          break;
      }
    }
    if (end.has_value()) finished_ = true;
  }
  // Never CloseStream here: a wake runs on the pushing thread, which may
  // hold the sync coordinator's lock that the loss listener takes.
  if (end.has_value()) {
    Finish(*end);
  } else {
    StartWrite(&out_);
  }
}

void AssignmentStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) write_failed_ = true;
  }
  // On gRPC's thread, holding no lock of the controller: the lease ends here.
  if (!ok) CloseLease("write to worker failed");
  const std::shared_ptr<Link> link = link_;  // `this` may be gone once Enter returns
  Enter(link);
}

void AssignmentStream::OnCancel() {
  cancelled_.store(true);
  CloseLease("worker disconnected");
  const std::shared_ptr<Link> link = link_;
  Enter(link);
}

void AssignmentStream::OnDone() {
  bool now = false;
  {
    absl::MutexLock lock(&link_->mu);
    link_->done = true;
    if (link_->active == 0) {
      link_->stream = nullptr;
      now = true;
    }
  }
  if (now) delete this;  // NOLINT: callback-API ownership
}

}  // namespace wsync::controller
