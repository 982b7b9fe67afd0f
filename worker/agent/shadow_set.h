// Staged syncs (docs/staging.md): the shadow copies of one worker's
// destination buffers. A staged sync binds its plan to registry(), where the
// destination side of every buffer the part writes points at the buffer's
// shadow; the live tensors keep serving. Commit() copies each shadow into its
// live buffer; Discard() after a rollback marks the shadows partly written.
//
// Invariant: outside the bytes the current part writes, a shadow equals its
// live buffer (each shadow is filled from the live buffer when allocated and
// again before the first use after a Discard), so the commit may copy each
// shadow whole ([0, extent), common/shadow_extents.h).
//
// Not thread-safe: the sync runner's thread owns it.
#ifndef WSYNC_WORKER_AGENT_SHADOW_SET_H_
#define WSYNC_WORKER_AGENT_SHADOW_SET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "worker/exec/buffer_registry.h"
#include "worker/plane/backend.h"
#include "worker/plane/data_ops.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::agent {

class ShadowSet {
 public:
  // `backend` is not owned and outlives the set. `budget_bytes` (the
  // worker's --staging_budget_bytes; 0: no limit) bounds bytes().
  ShadowSet(plane::Backend* backend, int64_t budget_bytes);

  // Shadows for `extents` (plan buffer name -> bytes, ShadowExtents) in
  // `mode` (a shadow mode) over `live` (destination side); kept from the last
  // call when the same buffers, mode and live registry generation, else
  // allocated afresh. RESOURCE_EXHAUSTED naming `who`, the sizes and the flag
  // when over budget; INVALID_ARGUMENT for a buffer `live` lacks or one
  // smaller than its extent.
  absl::Status Prepare(const std::map<std::string, int64_t>& extents, v1::StagingMode mode,
                       const exec::BufferRegistry& live, const std::string& who);

  // `live` with the shadows in place of the destination buffers (after
  // Prepare).
  const exec::BufferRegistry& registry() const { return registry_; }
  // Changes whenever registry() points at other memory.
  uint64_t generation() const { return registry_.generation(); }
  int64_t bytes() const { return bytes_; }

  // Copies every shadow into its live buffer and waits for it. The shadows
  // then equal the live buffers.
  absl::Status Commit();
  // After a rollback: the shadows hold part of a version; refilled from the
  // live buffers before their next use.
  void Discard() { dirty_ = true; }
  // Frees the shadows (e.g. when the owner registers again).
  void Clear();

 private:
  struct Shadow {
    exec::RegisteredBuffer live;
    exec::StagingBuffer memory;
    int64_t bytes = 0;
  };
  absl::Status EnsureOps();
  // Copies live -> shadow (to_live false) or shadow -> live for every shadow.
  absl::Status CopyAll(bool to_live);

  plane::Backend* const backend_;
  const int64_t budget_bytes_;
  std::unique_ptr<exec::DataOps> ops_;
  std::map<std::string, Shadow> shadows_;
  exec::BufferRegistry registry_;
  v1::StagingMode mode_ = v1::STAGING_IN_PLACE;
  uint64_t live_generation_ = 0;
  int64_t bytes_ = 0;
  bool dirty_ = false;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_SHADOW_SET_H_
