// The transport rendezvous store backed by the controller (KvSet / KvGet over
// gRPC, scoped by the lease and the transfer generation's key prefix). Get
// waits in short slices so that an abort ends a rendezvous promptly.
#ifndef WSYNC_WORKER_AGENT_CONTROLLER_KV_STORE_H_
#define WSYNC_WORKER_AGENT_CONTROLLER_KV_STORE_H_

#include <atomic>
#include <memory>
#include <string>

#include "worker/plane/kv_store.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::agent {

class ControllerKvStore : public transport::KvStore {
 public:
  // `aborted` (not owned, may be null) makes pending Gets fail with ABORTED.
  ControllerKvStore(std::shared_ptr<v1::WorkerService::Stub> stub, std::string lease_id,
                    const std::atomic<bool>* aborted)
      : stub_(std::move(stub)), lease_id_(std::move(lease_id)), aborted_(aborted) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) override;

 private:
  std::shared_ptr<v1::WorkerService::Stub> stub_;
  const std::string lease_id_;
  const std::atomic<bool>* aborted_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_CONTROLLER_KV_STORE_H_
