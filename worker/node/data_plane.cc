#include "worker/node/data_plane.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/node/local_only_transport.h"

namespace wsync::node {

absl::Status DataPlane::Complete(Channel& ch) {
  ASSIGN_OR_RETURN(ch.ops, backend_->NewDataOps());
  ASSIGN_OR_RETURN(ch.writer, backend_->NewPeerWriter(*ch.ops));
  ch.executor =
      std::make_unique<exec::Executor>(ch.transport.get(), ch.ops.get(), ch.writer.get(), options_);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Channel>> DataPlane::Attach(
    std::unique_ptr<transport::Transport> transport, int64_t generation) {
  if (transport->memory_space() != backend_->memory_space()) {
    return absl::InvalidArgumentError(absl::StrCat("transport ", transport->Name(),
                                                   " moves another memory space than backend ",
                                                   backend_->Name()));
  }
  auto ch = std::make_unique<Channel>();
  ch->generation = generation;
  ch->transport = std::move(transport);
  RETURN_IF_ERROR(Complete(*ch));
  return ch;
}

absl::StatusOr<std::unique_ptr<Channel>> DataPlane::Connect(const plane::ConnectOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> t, backend_->Connect(options));
  return Attach(std::move(t));
}

absl::StatusOr<std::unique_ptr<Channel>> DataPlane::LocalOnly(int32_t rank, int32_t size) {
  return Attach(std::make_unique<LocalOnlyTransport>(rank, size, backend_->memory_space()));
}

absl::StatusOr<Channel*> DataPlane::Ensure(
    const std::string& transfer, const ChannelSpec& spec,
    const std::function<std::unique_ptr<transport::KvStore>()>& store) {
  const int32_t rank = spec.connect.rank;
  std::unique_ptr<Channel>& ch = channels_[spec.network ? transfer : transfer + "#local"];
  if (!spec.network) {
    if (ch == nullptr || ch->transport->rank() != rank) {
      ASSIGN_OR_RETURN(ch, LocalOnly(rank, rank + 1));
      ++channels_created_;
    }
    return ch.get();
  }
  if (ch != nullptr && ch->generation == spec.generation && ch->transport->rank() == rank) {
    return ch.get();
  }
  ch.reset();  // the old generation's sockets close before the new rendezvous
  const std::string mine = plane::TransportKindName(backend_->transport_kind());
  if (spec.kind != backend_->transport_kind()) {
    return absl::FailedPreconditionError(
        absl::StrCat("transport kind '", plane::TransportKindName(spec.kind),
                     "' is not available on this worker (it runs ", mine,
                     backend_->memory_space() == plane::MemorySpace::kCuda ? " on device memory"
                                                                           : " on host memory",
                     ")"));
  }
  std::unique_ptr<transport::KvStore> kv = store();
  plane::ConnectOptions o = spec.connect;
  o.store = kv.get();
  auto t = backend_->Connect(o);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat(mine, " transport setup (generation ", spec.generation,
                                     ", rank ", rank, "/", o.size, "): ", t.status().message()));
  }
  ASSIGN_OR_RETURN(ch, Attach(*std::move(t), spec.generation));
  ++channels_created_;
  return ch.get();
}

void DataPlane::Drop(const std::string& transfer) {
  channels_.erase(transfer);
  channels_.erase(transfer + "#local");
}

}  // namespace wsync::node
