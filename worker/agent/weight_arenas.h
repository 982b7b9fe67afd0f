// The remappable arenas an owner allocated its weights in through its
// embedded worker (docs/commit-swap.md): created by the owner
// (EmbeddedWorker::CreateWeightArena), looked up by the sync runner's
// ShadowSet, which commits a staged sync whose destinations all lie in one
// arena by swapping the arena's memory with a twin. The set and every
// holder share each arena: freed from the set, an arena's memory lives
// until the owner's last view and any twin pairing drop it.
//
// Thread-safe: the owner creates and frees while the sync thread looks up.
#ifndef WSYNC_WORKER_AGENT_WEIGHT_ARENAS_H_
#define WSYNC_WORKER_AGENT_WEIGHT_ARENAS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/plane/backend.h"
#include "worker/plane/swap_arena.h"

namespace wsync::agent {

class WeightArenas {
 public:
  // `backend` (not owned, outlives the set) makes the arenas.
  explicit WeightArenas(plane::Backend* backend) : backend_(backend) {}

  struct Entry {
    int64_t handle = 0;  // unique in this set, > 0
    std::shared_ptr<plane::SwapArena> arena;
  };
  // A new arena of at least `bytes` bytes in the backend's memory, named
  // "<name>" (or "arena-<handle>" when empty). The backend's errors, naming
  // the arena and `who`.
  absl::StatusOr<Entry> Create(int64_t bytes, const std::string& name, const std::string& who);
  // Drops `handle` from the set (NOT_FOUND naming it when unknown). Its
  // memory lives while a holder keeps the arena.
  absl::Status Free(int64_t handle);
  // The arena holding all of [data, data + bytes), or null.
  std::shared_ptr<plane::SwapArena> Find(const void* data, int64_t bytes) const;
  int64_t size() const;
  // Whether a failed swap left an arena of the set unusable
  // (plane::SwapArena::usable); cheap (one look per arena).
  bool AnyUnusable() const;
  // FAILED_PRECONDITION when `data` lies in an arena a failed swap left
  // unusable, naming `who`, `what` (the tensor or buffer) and the arena, and
  // saying what the owner must do; OK otherwise (also outside every arena).
  absl::Status CheckUsable(const void* data, const std::string& who, const std::string& what) const;

 private:
  plane::Backend* const backend_;
  mutable absl::Mutex mu_;
  int64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::shared_ptr<plane::SwapArena>> arenas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_WEIGHT_ARENAS_H_
