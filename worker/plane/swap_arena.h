// Remappable weight arenas (docs/commit-swap.md): a reserved address range
// backed by physical memory that can exchange its backing with a twin of the
// same size, both addresses staying valid. An owner allocates its weights in
// one arena; a staged sync writes the new version into a twin and commits by
// swapping the backings (no byte of the arena is copied), so the live
// address serves the new version and the twin's address holds the old one.
//
// Contract of every implementation (tests/worker/plane/swap_arena_conformance.h):
// - base() stays the same for the arena's life and is aligned to at least
//   kSwapArenaAlignment; bytes() is the size asked for, rounded up to the
//   implementation's granularity (never less).
// - SwapWith(twin): afterwards the bytes read at base() are those the twin
//   held before, and the twin's base() reads what this arena held; neither
//   address changes, pointers into either stay valid, and views over them
//   (numpy, torch) see the exchanged data. No one may read or write either
//   range during the swap. On error both ranges keep (or get back) their
//   own backing and the status names both arenas; where putting a range
//   back failed too (its range may be left unmapped), that arena is marked
//   unusable (usable() false) and the status says so.
// - BeginSwap(twin) then FinishSwap(twin): the same exchange in two steps, so
//   that the live range waits only for the first. After BeginSwap, base()
//   reads what the twin held (as after SwapWith); the twin's range reads
//   undefined bytes and must be neither read nor written until FinishSwap,
//   which must come before the twin is used or either arena swaps again.
//   The two are partners until then: a BeginSwap of either (with any twin)
//   and a FinishSwap on another pair are refused (FAILED_PRECONDITION naming
//   the unfinished partner). A BeginSwap error leaves both on their own
//   backing (or marks one unusable), as for SwapWith; a FinishSwap error
//   leaves base() on its new backing and the twin unusable (discard it); the
//   status names the twin. Destroying either partner ends the partnership.
// - Destruction unmaps the range and frees the backing. The owner must not
//   use a pointer into the arena after that.
// Not thread-safe: one thread swaps at a time (the sync runner's).
#ifndef WSYNC_WORKER_PLANE_SWAP_ARENA_H_
#define WSYNC_WORKER_PLANE_SWAP_ARENA_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wsync::plane {

// Every arena's base is aligned to this (covers every dtype and vector load).
inline constexpr int64_t kSwapArenaAlignment = 4096;

class SwapArena {
 public:
  // Ends an unfinished swap's partnership (the partner may swap again).
  virtual ~SwapArena();
  SwapArena(const SwapArena&) = delete;
  SwapArena& operator=(const SwapArena&) = delete;

  void* base() const { return base_; }
  int64_t bytes() const { return bytes_; }
  // CUDA device of the memory; -1: host memory.
  virtual int device() const = 0;
  // For messages: "host arena 'NAME' (N bytes at 0x...)".
  std::string Describe() const;
  // Whether [data, data + bytes) lies inside this arena (overflow-safe).
  bool Contains(const void* data, int64_t bytes) const;
  // False once a failed swap could not give this range its memory back:
  // the range may be unmapped, so nothing may read or write it again (the
  // worker refuses every staged sync into it; the owner must free it).
  bool usable() const { return usable_.load(std::memory_order_acquire); }

  // Waits for the work queued on the arena's device by any stream of this
  // process (a flip commit's partner is written only after the owner's
  // reads of it ended); host arenas return at once.
  virtual absl::Status WaitForDevice() { return absl::OkStatus(); }
  // A new arena of the same kind, device and size (its content undefined),
  // named `name`: the twin a staged sync writes into.
  virtual absl::StatusOr<std::unique_ptr<SwapArena>> NewTwin(const std::string& name) const = 0;
  // Exchanges the backing of this arena and `twin` (see the contract above):
  // both steps; when the second fails, UndoSwap puts each range back on its
  // own memory (and only a range that could not be put back is unusable).
  // INVALID_ARGUMENT when the twin is of another kind, device or size.
  absl::Status SwapWith(SwapArena& twin);
  // The two steps of SwapWith (see the contract above); the partner checks
  // are here, the remapping in the implementation's DoBeginSwap /
  // DoFinishSwap.
  absl::Status BeginSwap(SwapArena& twin);
  absl::Status FinishSwap(SwapArena& twin);
  // The arena this one's unfinished two-step swap is with; null: none.
  const SwapArena* swap_partner() const { return partner_; }

 protected:
  SwapArena(std::string name, void* base, int64_t bytes)
      : name_(std::move(name)), base_(base), bytes_(bytes) {}
  virtual const char* kind() const = 0;  // "host", "cuda"
  // The implementation's steps (the partner checks are done). DoBeginSwap:
  // INVALID_ARGUMENT for a twin of another kind, device or size (or this
  // arena); on any error both ranges are on their own memory, or the one
  // that could not be put back is marked unusable. DoFinishSwap: on error
  // the twin's range may be left without memory (the caller marks it
  // unusable or undoes the swap). UndoSwap, after a DoBeginSwap and a failed
  // DoFinishSwap: each range back on its own memory; marks unusable each one
  // that cannot be, and says so in its error.
  virtual absl::Status DoBeginSwap(SwapArena& twin) = 0;
  virtual absl::Status DoFinishSwap(SwapArena& twin) = 0;
  virtual absl::Status UndoSwap(SwapArena& twin) = 0;
  const std::string& name() const { return name_; }
  // A failed swap left this range without (or with unknown) memory.
  void MarkUnusable() { usable_.store(false, std::memory_order_release); }

 private:
  const std::string name_;
  void* const base_;
  const int64_t bytes_;
  std::atomic<bool> usable_{true};
  // Between BeginSwap and FinishSwap: the other arena, on both; began_ on
  // the one BeginSwap was called on (the live one).
  SwapArena* partner_ = nullptr;
  bool began_ = false;
};

// Rounds `bytes` up to a multiple of `granularity` (a power of two or any
// positive value); INVALID_ARGUMENT naming `what` for a size <= 0 or one
// whose rounding overflows int64.
absl::StatusOr<int64_t> RoundArenaBytes(int64_t bytes, int64_t granularity,
                                        const std::string& what);

}  // namespace wsync::plane

#endif  // WSYNC_WORKER_PLANE_SWAP_ARENA_H_
