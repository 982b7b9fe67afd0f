// The tensors owner processes registered with this worker: (group, name) ->
// memory the worker's backend opened (plane::Backend::OpenBuffer: a mapped
// POSIX shared-memory object on the host backend, device memory opened from
// a CUDA IPC handle on the CUDA one). Thread-safe. Snapshots keep the
// mappings alive, so a sync in flight never sees memory unmapped under it
// when the owner re-registers; a mapping is released with the last entry or
// snapshot that uses it.
#ifndef WSYNC_WORKER_AGENT_TENSOR_TABLE_H_
#define WSYNC_WORKER_AGENT_TENSOR_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/plane/backend.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

struct TensorEntry {
  std::string group;
  v1::TensorRegistration reg;
  std::shared_ptr<void> hold;  // keeps its mapping open
  std::string identity;        // of the object mapped ("" for device memory)
  void* data = nullptr;
  int64_t bytes = 0;
};

struct TensorSnapshot {
  uint64_t version = 0;
  std::vector<TensorEntry> tensors;
};

class TensorTable {
 public:
  // `groups`: the worker's memberships; registrations for others are refused.
  // `backend` (not owned) opens the registrations; those of another memory
  // space are refused.
  TensorTable(std::vector<std::string> groups, plane::Backend* backend)
      : groups_(std::move(groups)), backend_(backend) {}

  absl::StatusOr<v1::RegisterTensorsResponse> Register(const v1::RegisterTensorsRequest& req);
  TensorSnapshot Snapshot() const;
  std::vector<v1::BufferInfo> BufferInfos() const;
  // What BufferInfos() reports for one entry.
  static v1::BufferInfo InfoOf(const TensorEntry& e);
  uint64_t version() const;

 private:
  const std::vector<std::string> groups_;
  plane::Backend* const backend_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, std::string>, TensorEntry> tensors_ ABSL_GUARDED_BY(mu_);
  // Open mappings (weak: they die with their last tensor).
  plane::MappingCache mappings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_TENSOR_TABLE_H_
