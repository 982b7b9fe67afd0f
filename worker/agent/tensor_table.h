// The tensors owner processes registered with this worker: (group, name) ->
// bytes in a mapped POSIX shared-memory object (host workers), or device
// memory opened from a CUDA IPC handle (workers with a GPU plane). Thread-safe.
// Snapshots keep shm and CUDA IPC mappings alive, so a sync in flight never
// sees memory unmapped under it when the owner re-registers; a mapping is
// released with the last entry or snapshot that uses it.
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
#include "worker/agent/gpu_plane.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/worker_local.pb.h"

namespace wsync::agent {

// One mmap of a whole shared-memory object; unmapped on destruction.
class ShmMapping {
 public:
  // Maps `name` read-write. Errors name the object.
  static absl::StatusOr<std::shared_ptr<ShmMapping>> Open(const std::string& name);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // "<st_dev>:<st_ino>" of the object mapped: a name unlinked and created
  // again names another object.
  const std::string& identity() const { return identity_; }

 private:
  ShmMapping(std::string name, std::string identity, uint8_t* data, int64_t size)
      : name_(std::move(name)), identity_(std::move(identity)), data_(data), size_(size) {}
  std::string name_;
  std::string identity_;
  uint8_t* data_;
  int64_t size_;
};

struct TensorEntry {
  std::string group;
  v1::TensorRegistration reg;
  std::shared_ptr<ShmMapping> mapping;  // null for device memory
  std::shared_ptr<void> device_memory;  // holds its CUDA IPC mapping open
  bool on_device = false;
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
  // `gpu` (not owned, may be null): where CUDA IPC registrations are opened;
  // with one, host (shm) registrations are refused, and without one, IPC ones.
  explicit TensorTable(std::vector<std::string> groups, GpuPlane* gpu = nullptr)
      : groups_(std::move(groups)), gpu_(gpu) {}

  absl::StatusOr<v1::RegisterTensorsResponse> Register(const v1::RegisterTensorsRequest& req);
  TensorSnapshot Snapshot() const;
  std::vector<v1::BufferInfo> BufferInfos() const;
  // What BufferInfos() reports for one entry.
  static v1::BufferInfo InfoOf(const TensorEntry& e);
  uint64_t version() const;

 private:
  const std::vector<std::string> groups_;
  GpuPlane* const gpu_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, std::string>, TensorEntry> tensors_ ABSL_GUARDED_BY(mu_);
  // Open mappings by object name (weak: they die with their last tensor).
  std::map<std::string, std::weak_ptr<ShmMapping>> mappings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_TENSOR_TABLE_H_
