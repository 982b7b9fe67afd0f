// ShadowSet's flip commits (docs/commit-flip.md): the owner keeps its weights
// in a flip pair of arenas and serves from one; a staged sync writes the
// other, and the commit hands it over. Nothing is remapped and nothing the
// sync wrote is copied: the pause is the owner's pointer switch.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/agent/shadow_set.h"

namespace wsync::agent {

absl::Status ShadowSet::PrepareFlip(const std::map<std::string, BufferWrites>& writes,
                                    v1::StagingMode mode, const exec::BufferRegistry& live,
                                    const std::string& who, std::shared_ptr<plane::SwapArena> arena,
                                    std::shared_ptr<plane::SwapArena> partner) {
  // The partner is what the owner served before the pair's last flip: it
  // is written only once the owner has left it, and its queued reads ended.
  bool acked = false;
  RETURN_IF_ERROR(arenas_->AwaitAck(arena.get(), arenas_->flip_ack_wait(), who, &acked));
  // Live must be the arena the owner serves: a registration pointing back
  // at the arena the last flip left would make the partner the one served.
  RETURN_IF_ERROR(arenas_->CheckServed(arena.get(), who, "the staged sync's destinations"));
  if (acked) {
    if (absl::Status s = partner->WaitForDevice(); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat(who, ": before writing ", partner->Describe(),
                                 ", the flip partner of ", arena->Describe(), ": ", s.message()));
    }
    arenas_->DeviceWaited(arena.get());
  }
  Clear();
  RETURN_IF_ERROR(EnsureOps());
  arena_ = std::move(arena);
  flip_to_ = std::move(partner);
  mode_ = mode;
  who_ = who;
  // The partner is the owner's memory: no shadow memory is allocated here.
  bytes_ = 0;
  dirty_ = false;
  absl::Status s = PointDestinationsAt(writes, live, flip_to_->base());
  // As for a swap's twin, the partner may hold anything outside the views
  // the part writes (the version before, a discarded one): the commit copies
  // every other arena byte live -> partner.
  if (s.ok()) s = PlanSwapCommit(writes, live, who);
  if (!s.ok()) Clear();
  return s;
}

absl::Status ShadowSet::CommitFlip() {
  // The sync's own writes into the partner are complete: the executor's run
  // waited for every stream that wrote it (its data ops, the transport's
  // rounds) before the staged report, as the copy commit assumes too.
  if (arenas_->PartnerOf(arena_.get()) != flip_to_) {
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat(who_, ": flip commit of ", arena_->Describe(), ": ", flip_to_->Describe(),
                     " is no longer its flip partner (freed); nothing moved: the live tensors "
                     "keep the version they held, whole"));
    Clear();
    return s;
  }
  Lap lap;
  absl::Status s = RunCopies(commit_items_, commit_names_,
                             "copying the bytes the sync does not write (live -> flip partner)");
  commit_times_.copy_s = lap();
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat(who_, ": flip commit of ", arena_->Describe(), " onto ",
                                            flip_to_->Describe(), ": ", s.message(),
                                            "; nothing moved: the live tensors keep the version "
                                            "they held, whole"));
    Clear();
    return s;
  }
  flipped_ = Flip{arena_, flip_to_};
  // The next sync's live arena is the partner: the next Prepare derives
  // everything again. The registry (every buffer of the worker, ~1 ms to
  // free for 19 k) is freed there, not inside the commit.
  retired_ = std::move(registry_);
  registry_ = exec::BufferRegistry();
  flip_to_.reset();
  arena_.reset();
  commit_items_.clear();
  commit_names_.clear();
  commit_bytes_ = 0;
  return absl::OkStatus();
}

}  // namespace wsync::agent
