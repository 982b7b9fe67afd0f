// Staged syncs (docs/staging.md): the shadow copies of one worker's
// destination buffers. A staged sync binds its plan to registry(), where the
// destination side of every buffer the part writes points at the buffer's
// shadow; the live tensors keep serving. Commit() copies into each live
// buffer exactly the views the part writes (from the shadow); Discard()
// after a rollback marks the shadows partly written.
//
// The commit never touches a live byte the part does not write: anything
// else may write the live tensors between two staged syncs (an in-place
// sync of another transfer, a peer's direct write, the owner) without a
// reused shadow reverting it. Shadows are filled from the live buffers when
// allocated and again before the first use after a Discard, so a shadow
// byte outside the written views holds live data, but the commit does not
// depend on it.
//
// Swap commits (docs/commit-swap.md; shadow_set_swap.cc): when every
// destination buffer of the part lies in one arena of `arenas` (the owner
// allocated its weights there through its embedded worker), every view
// lists as byte runs (dense or strided) and the mode is device_shadow (or host_shadow over a host
// arena), the shadow is a twin of the whole arena (its full size counts against the budget), each
// destination points at the twin's base plus its offset, and Commit() copies the arena bytes the
// part does not write live -> twin, then swaps the two arenas' memory: no written byte is copied,
// the live addresses stay. Otherwise the commit copies, as above. A swap that fails leaves the live
// arena on its own memory (V-1, whole: the seam's contract), names the worker and the arena, and
// drops the twin (the next sync makes a new one); one whose arena could not get its memory back
// (usable() false) says so, and every later Prepare over that arena is refused.
//
//
// Flip commits (docs/commit-flip.md; shadow_set_flip.cc): when the arena
// every destination lies in has a flip partner (WeightArenas::CreatePair),
// the shadow is the partner itself (no memory allocated, no fill): each
// destination points at the partner's base plus its offset. Prepare first
// waits for the owner's acknowledgement of the pair's last flip
// (WeightArenas::AwaitAck) and, after one, for the device's queued work.
// Commit() copies the arena bytes the part does not write live -> partner
// and copies nothing else; the caller then moves the live tensors onto the
// partner (flipped(): TensorTable::Rebase, WeightArenas::Flipped) and the
// owner switches its pointers. A flip commit that fails has moved nothing:
// the live arena keeps the version it served, whole.
//
// Not thread-safe: the sync runner's thread owns it.
#ifndef WSYNC_WORKER_AGENT_SHADOW_SET_H_
#define WSYNC_WORKER_AGENT_SHADOW_SET_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/shadow_extents.h"
#include "worker/agent/weight_arenas.h"
#include "worker/exec/buffer_registry.h"
#include "worker/plane/backend.h"
#include "worker/plane/data_ops.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::agent {

class ShadowSet {
 public:
  // Where the last Commit's time went, in seconds (all 0 before the first,
  // and the phases a failed one did not reach):
  //   wait_ops_s  a swap commit's wait for the set's own copy stream (the
  //               sync's writes into the twin are waited for by the swap's
  //               device-wide synchronisation, in swap_s); 0 for a copy
  //               commit;
  //   copy_s      the copies: a swap commit's arena bytes the part does not
  //               write (live -> twin), a copy commit's every written view;
  //   swap_s      a swap commit's plane::SwapArena::BeginSwap: the wait for
  //               the whole device, then the live range's remap.
  struct CommitTimes {
    double wait_ops_s = 0;
    double copy_s = 0;
    double swap_s = 0;
  };

  // `backend` is not owned and outlives the set. `budget_bytes` (the
  // worker's --staging_budget_bytes; 0: no limit) bounds bytes(). `arenas`
  // (not owned, may be null: no swap commits) outlives the set.
  ShadowSet(plane::Backend* backend, int64_t budget_bytes, WeightArenas* arenas = nullptr);

  // Shadows for `writes` (plan buffer name -> extent and written views,
  // ShadowWrites) in `mode` (a shadow mode) over `live` (destination side);
  // kept from the last call when the same buffers, extents, mode and live
  // registry generation, else allocated afresh. The next Commit copies
  // `writes`' views. RESOURCE_EXHAUSTED naming `who`, the sizes and the flag
  // when over budget; INVALID_ARGUMENT for a buffer `live` lacks, one smaller
  // than its extent or a view the data ops cannot copy.
  absl::Status Prepare(const std::map<std::string, BufferWrites>& writes, v1::StagingMode mode,
                       const exec::BufferRegistry& live, const std::string& who);

  // `live` with the shadows in place of the destination buffers (after
  // Prepare).
  const exec::BufferRegistry& registry() const { return registry_; }
  // Changes whenever registry() points at other memory.
  uint64_t generation() const { return registry_.generation(); }
  int64_t bytes() const { return bytes_; }

  // Copies the written views of every shadow into its live buffer (those of
  // the last Prepare) and waits for it. A swap commit returns once the live
  // range serves the new version (plane::SwapArena::BeginSwap); the twin's
  // half of the swap is left to FinishSwap.
  absl::Status Commit();
  // Ends a swap commit's exchange (remaps the twin's range); a no-op
  // otherwise. Prepare calls it first; a caller may call it earlier, once
  // the pause is over. On error the twin is dropped (the next Prepare makes
  // a new one) and the status names it.
  absl::Status FinishSwap();
  // Bytes the next Commit copies (overlapping views counted once per view;
  // a swap commit: the arena bytes the part does not write).
  int64_t commit_bytes() const { return commit_bytes_; }
  // How the next Commit runs: "swap", "flip" or "copy" (after Prepare).
  const char* commit_kind() const {
    return twin_ != nullptr ? "swap" : flip_to_ != nullptr ? "flip" : "copy";
  }
  // After a flip Commit: the arena the live tensors lay in and the one the
  // commit moves them onto (the caller rebases the tensors); both null
  // otherwise. Cleared by the next Prepare.
  struct Flip {
    std::shared_ptr<plane::SwapArena> from;
    std::shared_ptr<plane::SwapArena> to;
  };
  const Flip& flipped() const { return flipped_; }
  // Why the last Prepare commits by copy although its destinations lie in
  // one arena (a view that does not list as byte runs for a swap:
  // swap_runs.h); "" otherwise. Logged once each time it changes.
  const std::string& copy_reason() const { return copy_reason_; }
  const CommitTimes& last_commit_times() const { return commit_times_; }
  // After a rollback: the shadows hold part of a version; refilled from the
  // live buffers before their next use.
  void Discard() { dirty_ = true; }
  // Frees the shadows (e.g. when the owner registers again).
  void Clear();

 private:
  // Seconds since construction or the previous call (a steady clock).
  class Lap {
   public:
    double operator()() {
      const auto now = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(now - last_).count();
      last_ = now;
      return s;
    }

   private:
    std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  };
  struct Shadow {
    exec::RegisteredBuffer live;
    exec::StagingBuffer memory;
    int64_t bytes = 0;
  };
  absl::Status EnsureOps();
  // Swap commits (shadow_set_swap.cc). FAILED_PRECONDITION naming `who` and
  // the arena when a buffer of `writes` lies in an arena a failed swap left
  // unusable.
  absl::Status CheckArenasUsable(const std::map<std::string, BufferWrites>& writes,
                                 const exec::BufferRegistry& live, const std::string& who) const;
  // The arena every destination of `writes` lies in when the commit can
  // swap, else null; `why` says why it is null although the destinations
  // lie in one arena.
  std::shared_ptr<plane::SwapArena> SwapArenaFor(const std::map<std::string, BufferWrites>& writes,
                                                 v1::StagingMode mode,
                                                 const exec::BufferRegistry& live,
                                                 std::string* why) const;
  absl::Status PrepareSwap(const std::map<std::string, BufferWrites>& writes, v1::StagingMode mode,
                           const exec::BufferRegistry& live, const std::string& who,
                           std::shared_ptr<plane::SwapArena> arena);
  // Flip commits (shadow_set_flip.cc): `partner` is `arena`'s flip partner.
  absl::Status PrepareFlip(const std::map<std::string, BufferWrites>& writes, v1::StagingMode mode,
                           const exec::BufferRegistry& live, const std::string& who,
                           std::shared_ptr<plane::SwapArena> arena,
                           std::shared_ptr<plane::SwapArena> partner);
  absl::Status CommitFlip();
  // `live` with every destination of `writes` at `base` plus its offset in
  // arena_ (a twin's or a flip partner's), into registry_.
  absl::Status PointDestinationsAt(const std::map<std::string, BufferWrites>& writes,
                                   const exec::BufferRegistry& live, void* base);
  // Allocates the twin, points the destinations at it and fills it.
  absl::Status MakeTwin(const std::map<std::string, BufferWrites>& writes,
                        const exec::BufferRegistry& live, const std::string& who);
  // The commit's live -> twin (or flip partner) copies of the arena bytes
  // `writes` leaves.
  absl::Status PlanSwapCommit(const std::map<std::string, BufferWrites>& writes,
                              const exec::BufferRegistry& live, const std::string& who);
  absl::Status CommitSwap();
  // Copies live -> shadow, whole, for every shadow.
  absl::Status Fill();
  // The commit's copies of `writes`' views, shadow -> live.
  absl::Status PlanCommit(const std::map<std::string, BufferWrites>& writes,
                          const std::string& who);
  // Runs `items` and waits; errors name the buffer of the failed item.
  absl::Status RunCopies(const std::vector<exec::CopyItem>& items,
                         const std::vector<const std::string*>& names, const char* what);

  plane::Backend* const backend_;
  const int64_t budget_bytes_;
  WeightArenas* const arenas_;
  // A swap commit's live arena and its twin (both null otherwise); the
  // extents of the buffers the twin stands in for.
  std::shared_ptr<plane::SwapArena> arena_;
  std::unique_ptr<plane::SwapArena> twin_;
  std::map<std::string, int64_t> twin_extents_;
  // A flip commit's partner of arena_ (null otherwise), and the last flip.
  std::shared_ptr<plane::SwapArena> flip_to_;
  Flip flipped_;
  std::string who_;  // the worker, for the commit's errors (Prepare's `who`)
  std::string copy_reason_;
  std::unique_ptr<exec::DataOps> ops_;
  std::map<std::string, Shadow> shadows_;
  exec::BufferRegistry registry_;
  exec::BufferRegistry retired_;  // a flip commit's registry, freed by Clear
  v1::StagingMode mode_ = v1::STAGING_IN_PLACE;
  uint64_t live_generation_ = 0;
  int64_t bytes_ = 0;
  bool dirty_ = false;
  // A swap commit began and FinishSwap has not run.
  bool swap_unfinished_ = false;
  // Commit(): shadow -> live copies of the written views, each item's buffer.
  std::vector<exec::CopyItem> commit_items_;
  std::vector<const std::string*> commit_names_;
  int64_t commit_bytes_ = 0;
  CommitTimes commit_times_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_SHADOW_SET_H_
