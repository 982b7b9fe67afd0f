// The remappable arenas an owner allocated its weights in through its
// embedded worker (docs/commit-swap.md): created by the owner
// (EmbeddedWorker::CreateWeightArena), looked up by the sync runner's
// ShadowSet, which commits a staged sync whose destinations all lie in one
// arena by swapping the arena's memory with a twin. The set and every
// holder share each arena: freed from the set, an arena's memory lives
// until the owner's last view and any twin pairing drop it.
//
// Flip pairs (docs/commit-flip.md): two arenas of one size the owner keeps
// its weights in turn by turn. The owner serves from one; a staged sync
// whose destinations all lie in it writes the other at the same offsets,
// and the commit hands the owner the other one (the owner switches its
// pointers between two steps and acknowledges, AckFlip). The set records
// the pairing and the handshake: after a flip, the arena the owner left may
// be written again only once the owner has acknowledged it (AwaitAck).
//
// Thread-safe: the owner creates and frees while the sync thread looks up.
#ifndef WSYNC_WORKER_AGENT_WEIGHT_ARENAS_H_
#define WSYNC_WORKER_AGENT_WEIGHT_ARENAS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/plane/backend.h"
#include "worker/plane/swap_arena.h"

namespace wsync::agent {

class WeightArenas {
 public:
  // `backend` (not owned, outlives the set) makes the arenas.
  // `flip_ack_wait`: how long a staged sync into a flip pair waits for the
  // owner's acknowledgement of the pair's last flip (AwaitAck).
  explicit WeightArenas(plane::Backend* backend, absl::Duration flip_ack_wait = absl::Seconds(30))
      : backend_(backend), flip_ack_wait_(flip_ack_wait) {}
  absl::Duration flip_ack_wait() const { return flip_ack_wait_; }

  struct Entry {
    int64_t handle = 0;  // unique in this set, > 0
    std::shared_ptr<plane::SwapArena> arena;
  };
  // A new arena of at least `bytes` bytes in the backend's memory, named
  // "<name>" (or "arena-<handle>" when empty). The backend's errors, naming
  // the arena and `who`.
  absl::StatusOr<Entry> Create(int64_t bytes, const std::string& name, const std::string& who);
  // Two arenas of `bytes` bytes, "<name>.0" and "<name>.1" (name empty:
  // "pair-<handle>"), recorded as each other's flip partner. The backend's
  // errors as Create's; neither is kept when the second cannot be made.
  absl::StatusOr<std::pair<Entry, Entry>> CreatePair(int64_t bytes, const std::string& name,
                                                     const std::string& who);
  // Drops `handle` from the set (NOT_FOUND naming it when unknown), and its
  // pairing: its partner stays an arena of the set, without a partner. Its
  // memory lives while a holder keeps the arena.
  absl::Status Free(int64_t handle);
  // The flip partner of `arena` (null: none, or not of this set).
  std::shared_ptr<plane::SwapArena> PartnerOf(const plane::SwapArena* arena) const;
  // The handle of `arena` in the set (0: not of it).
  int64_t HandleOf(const plane::SwapArena* arena) const;
  // The sync runner flipped the owner's weights of sync `sync_id` onto
  // `to`: until the owner acknowledges (Ack), AwaitAck over the pair waits,
  // and from now on the pair serves from `to` (CheckServed). False (nothing
  // recorded) when `to` is no longer of a pair (the owner freed it).
  bool Flipped(const plane::SwapArena* to, const std::string& sync_id);
  // FAILED_PRECONDITION naming `who`, `what`, the arena and the flip when
  // `arena` (or the arena holding `data`) is the one a pair's last flip
  // left: the owner serves the other, so a sync must neither read it as live
  // nor write its partner (the arena served). OK otherwise.
  absl::Status CheckServed(const plane::SwapArena* arena, const std::string& who,
                           const std::string& what) const;
  absl::Status CheckNotLeft(const void* data, const std::string& who,
                            const std::string& what) const;
  // The owner serves from arena `handle` now: no work it queues from now
  // on reads its partner (work queued before is waited for by the sync
  // runner before it writes the partner). NOT_FOUND for an unknown handle;
  // FAILED_PRECONDITION naming the arena when no flip onto it awaits an
  // acknowledgement (acknowledged already, or the flip went the other way).
  absl::Status Ack(int64_t handle);
  // Waits up to `wait` until no flip of `arena`'s pair awaits the owner's
  // acknowledgement; DEADLINE_EXCEEDED naming `who`, the sync and the arena
  // otherwise. `*acked` (if not null) tells whether an acknowledgement came
  // since the last call that reported one (the caller then waits for the
  // owner's queued work before writing the partner).
  // CANCELLED once Close was called (the worker stops); FAILED_PRECONDITION
  // when `arena` is no longer of a pair (freed meanwhile). `*acked` stays
  // set until DeviceWaited(arena).
  absl::Status AwaitAck(const plane::SwapArena* arena, absl::Duration wait, const std::string& who,
                        bool* acked = nullptr);
  // The caller waited for the device after an acknowledgement AwaitAck
  // reported: the next AwaitAck reports none until the next Ack.
  void DeviceWaited(const plane::SwapArena* arena);
  // The worker stops: every AwaitAck, now or later, returns CANCELLED.
  void Close();
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
  const absl::Duration flip_ack_wait_;
  mutable absl::Mutex mu_;
  int64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_pair_ ABSL_GUARDED_BY(mu_) = 1;  // names unnamed pairs
  std::map<int64_t, std::shared_ptr<plane::SwapArena>> arenas_ ABSL_GUARDED_BY(mu_);
  // A flip pair's handshake (both arenas map to one).
  struct Flip {
    const plane::SwapArena* awaiting = nullptr;  // flipped onto, not acknowledged
    std::string sync_id;                         // of that flip
    std::string onto;                            // `awaiting` described
    bool acked = false;                          // since DeviceWaited
    const plane::SwapArena* serving = nullptr;   // the last flip's `to`
  };
  std::map<const plane::SwapArena*, std::shared_ptr<plane::SwapArena>> partner_
      ABSL_GUARDED_BY(mu_);
  std::map<const plane::SwapArena*, std::shared_ptr<Flip>> flips_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_WEIGHT_ARENAS_H_
