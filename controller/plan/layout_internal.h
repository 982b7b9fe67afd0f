// Pieces of CompileSide shared between compiled_layout.cc (driver, explicit
// fragments), mesh_layout.cc (DTensor placements) and validate_layout.cc
// (cross-fragment checks). Not part of the planner's contract.
#ifndef WSYNC_CONTROLLER_PLAN_LAYOUT_INTERNAL_H_
#define WSYNC_CONTROLLER_PLAN_LAYOUT_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/plan/compiled_layout.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::plan::internal {

// `side "s" tensor "t"` prefix for error messages.
std::string Where(const std::string& side, const std::string& tensor);

// Appends the fragments that mesh layout `t.mesh()` puts on each rank (all in
// buffer `buffer_id`; CompileSide passes kTensorBuffer and keeps the buffer
// per tensor). Validates the mesh against `num_ranks` and `role`. Reads
// nothing of `t` but its mesh signature (dtype, shape, mesh shape, ranks,
// placements; `where` only for messages): CompileSide builds it once per
// signature and shares the result.
absl::Status AppendMeshFragments(const std::string& where, const v1::TensorLayout& t,
                                 int32_t num_ranks, SideRole role, int32_t buffer_id,
                                 std::vector<CompiledFragment>* out);

// Rejects two fragments (of any tensors) on one rank whose bytes in one buffer
// overlap. `from_mesh[t]`: tensor t came from a mesh layout, whose fragments on
// one rank are disjoint by construction and need no pairwise check. On a
// source, exact aliases (same bytes, same view shape) are allowed: reading
// the same memory twice is harmless (tied weights).
// Cost: a mesh tensor alone in its buffer costs O(1) (its buffer is
// CompiledTensor::mesh_buffer; its fragments, maybe shared with other
// tensors, are not walked): its shards tile the buffer from byte 0 and its
// extent fits int64 (CheckTensorHeader), so nothing in it can overlap. So a
// signature's fragments are checked once, when built, not once per tensor;
// tensors sharing one buffer (explicit, or meshes naming one buffer) are
// swept fragment by fragment, whatever they share.
absl::Status CheckByteOverlaps(const CompiledSide& side, const std::vector<bool>& from_mesh,
                               SideRole role);

// Destination only: no two fragments of one tensor on one rank may share an
// element (the planner would write it twice). Mesh tensors are skipped: they
// give each rank one shard whose fragments are disjoint by construction.
absl::Status CheckDestinationBoxOverlaps(const CompiledSide& side,
                                         const std::vector<bool>& from_mesh);

// Block fp8 quantization (block_quant_layout.cc): resolves every tensor's
// block_quantization into CompiledTensor's quantization fields and checks it:
// destination only, FP8_E4M3 tensor of rank >= 2, positive blocks, an FP32
// scale tensor of the block-grid shape used by one tensor only, fragments
// aligned to the block grid, and on every rank scale fragments that hold
// exactly the blocks of that rank's fragments.
absl::Status ResolveBlockQuantization(const v1::Side& side, SideRole role, CompiledSide* out);

// Number of bytes from a fragment's first to one past its last byte; 0 when
// the box is empty. Error on int64 overflow.
absl::Status ByteExtent(const CompiledFragment& f, int64_t elem_size, int64_t* extent);

}  // namespace wsync::plan::internal

#endif  // WSYNC_CONTROLLER_PLAN_LAYOUT_INTERNAL_H_
