// The tensors owner processes registered with this worker: (group, name) ->
// memory the worker's backend opened (plane::Backend::OpenBuffer: a mapped
// POSIX shared-memory object on the host backend, device memory opened from
// a CUDA IPC handle on the CUDA one). Thread-safe. Snapshots keep the
// mappings alive, so a sync in flight never sees memory unmapped under it
// when the owner re-registers; a mapping is released with the last entry or
// snapshot that uses it. An embedded worker's owner (the same process)
// registers its memory by pointer instead (RegisterLocal): nothing is mapped,
// and the entry's hold keeps the owner's memory alive.
#ifndef WSYNC_WORKER_AGENT_TENSOR_TABLE_H_
#define WSYNC_WORKER_AGENT_TENSOR_TABLE_H_

#include <unistd.h>

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

// Who registers: the owner process, as the worker's local socket identified
// its connection (SO_PEERCRED). A registration is replaced (`replace`, or a
// name registered again with another location) only by the process that made
// it, once that process is gone, or by an admin (--local_admin_uids).
struct Registrant {
  int64_t pid = static_cast<int64_t>(::getpid());
  bool admin = false;
};

struct TensorEntry {
  std::string group;
  int64_t owner_pid = 0;  // the Registrant's pid
  v1::TensorRegistration reg;
  std::shared_ptr<void> hold;  // keeps its mapping open
  // After a flip commit (Rebase): keeps the arena pair `data` lies in now
  // (`hold` stays as registered, so no owner reference is dropped on the
  // sync thread).
  std::shared_ptr<void> arena_hold;
  std::string identity;  // of the object mapped ("" for device memory)
  void* data = nullptr;
  int64_t bytes = 0;
};

// One tensor of the worker's own process, handed over by pointer.
struct LocalTensor {
  v1::TensorRegistration reg;                            // name, dtype, shape; no location
  void* data = nullptr;                                  // its first byte
  int64_t bytes = 0;                                     // at least elements * dtype size
  plane::MemorySpace space = plane::MemorySpace::kHost;  // where `data` points
  std::shared_ptr<void> hold;  // keeps the memory alive while registered or in a sync
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

  // Descriptor batches by token (CudaVmm.fd_token), claimed by the caller.
  using FdBatches = std::map<std::string, std::shared_ptr<const plane::FdBatch>>;

  // `fds` holds the batch of every token the request's CudaVmm entries name.
  // PERMISSION_DENIED (naming the tensor and its owner's pid) when `who`
  // may not replace an entry the request replaces (Registrant).
  absl::StatusOr<v1::RegisterTensorsResponse> Register(const v1::RegisterTensorsRequest& req,
                                                       const FdBatches& fds = {},
                                                       const Registrant& who = Registrant());
  // Registers memory of this process for `group` (replace: as the request's
  // flag). Refused, naming the tensor, with INVALID_ARGUMENT for a null
  // pointer, a size below elements * dtype size or a bad dtype / shape, and
  // FAILED_PRECONDITION for memory of another space than the backend's. A bad
  // entry changes nothing. Such entries report no location (BufferInfos): no
  // peer maps them.
  absl::StatusOr<v1::RegisterTensorsResponse> RegisterLocal(const std::string& group,
                                                            std::vector<LocalTensor> tensors,
                                                            bool replace);
  // Moves every entry lying wholly in [from, from + bytes) to the same
  // offset from `to` (whose memory `hold` keeps alive, as each entry's
  // arena_hold, from now on): a flip
  // commit handing the owner's weights over to the other arena of its pair
  // (docs/commit-flip.md). Returns how many moved; the version changes when
  // any did. Overflow-safe; entries partly inside stay (none lies across an
  // arena's end: the arena is one allocation).
  int64_t Rebase(const void* from, int64_t bytes, void* to, const std::shared_ptr<void>& hold);
  TensorSnapshot Snapshot() const;
  std::vector<v1::BufferInfo> BufferInfos() const;
  // What BufferInfos() reports for one entry.
  static v1::BufferInfo InfoOf(const TensorEntry& e);
  uint64_t version() const;
  // Objects mapped for the current entries (each object once), e.g. shm
  // objects; mappings no entry holds are forgotten at the next registration.
  size_t mapping_count() const;

 private:
  absl::Status CheckGroup(const std::string& group) const;
  // Refuses an entry replacing another one unless `replace`.
  absl::Status CheckConflict(const TensorEntry& e, bool replace) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refuses `who` replacing another live process's entries of `group`: all of
  // them with `replace`, else those named `names`.
  absl::Status CheckOwners(const std::string& group, const std::vector<std::string>& names,
                           bool replace, const Registrant& who) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::RegisterTensorsResponse Commit(const std::string& group, std::vector<TensorEntry> fresh,
                                     bool replace) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
