// Tensor stacking: many alike tensors planned as one (docs/plan-compact.md,
// section 6).
//
// Kimi-K2 from FSDP2 over 256 ranks has 69,120 expert tensors, each sharded
// over every rank: 17.9 M source shards, so every planner stage would hold
// tens of millions of records. Its 46,080 destination expert tensors fall
// into 32 groups whose members are laid out alike: same dtype, shape,
// fragment ranks, boxes and strides, and the same mapping geometry from
// sources laid out alike. Members differ only in names, buffers and byte
// offsets. Stacking plans each such group of M tensors as one tensor with a
// leading member dim of length M:
//  * fragment f of the group becomes fragment [0, M) x box_f of the stacked
//    tensor, in a virtual buffer of its own, member i at byte i x stride_f;
//    stride_f is the fragment's byte span plus one element, so that no view
//    over two members is ever contiguous (the planner sends a contiguous
//    piece without staging, which a run of members is not);
//  * mapping slot j (every member's j-th mapping entry) reads a stacked
//    source tensor over the members' j-th source tensors, built alike.
// The planner plans the stacked sides unchanged. UnstackPlan then writes
// every piece over a stacked tensor as its members, each with its real
// tensor name, buffers and byte offsets, grouped into PieceRuns.
//
// Stacked, the planner's records (cells, transfers, buckets) no longer grow
// with the number of alike tensors, and its decisions (source choice, relay,
// bucket packing) are made per group slice instead of per tensor, so the
// plan differs from the unstacked one; VerifyPlan (replay) is the oracle.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_STACKING_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_STACKING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/plan/compiled_layout.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

// Names of stacked tensors and virtual buffers start with this; a spec with
// a tensor or buffer named so is not stacked.
inline constexpr char kStackPrefix[] = "wsync.stack/";

// Where the members of one virtual buffer really are.
struct VirtualBuffer {
  int64_t member_bytes = 0;  // stride between members in the virtual buffer
  int32_t names = 0;         // StackedSides::name_blocks index: each member's buffer
  // Each member's byte offset in its buffer: offset_base + i x offset_step,
  // unless `offsets` is nonempty (then offsets[i]).
  int64_t offset_base = 0;
  int64_t offset_step = 0;
  std::vector<int64_t> offsets;

  int64_t MemberOffset(int64_t i) const {
    return offsets.empty() ? offset_base + i * offset_step : offsets[i];
  }
};

// The stacked form of a spec, its sides compiled.
struct StackedSides {
  CompiledSide src, dst;
  // The stacked spec's mappings and options (its sides are the ones above,
  // never read again from here).
  v1::TransferSpec spec;
  // Name lists, each the names of a group's members in member order: index
  // lists into the original source side's tensors (tensor blocks) or into
  // either side's buffer_names (buffer blocks; VirtualBuffer says which).
  struct NameBlock {
    bool tensors = false;  // source tensor indices; else buffer indices
    v1::BufferSide side = v1::SOURCE_BUFFER;
    std::vector<int32_t> index;
  };
  std::vector<NameBlock> name_blocks;
  // Virtual buffers by name, per side; stacked source tensors by name: the
  // name block of their members' (source tensor) names.
  absl::flat_hash_map<std::string, VirtualBuffer> src_buffers, dst_buffers;
  absl::flat_hash_map<std::string, int32_t> tensor_names;
  int32_t groups = 0;   // stacked destination groups
  int64_t members = 0;  // destination tensors in them
};

// Finds the groups of alike destination tensors (at least `min_members`
// each) and builds the stacked sides. Validates the spec's mappings first
// (as the planner does: every error names the mapping and tensor). Returns
// a StackedSides with groups == 0 when nothing stacks.
absl::StatusOr<StackedSides> StackSides(const v1::TransferSpec& spec, const CompiledSide& source,
                                        const CompiledSide& destination, int min_members = 2);

// Rewrites `plan`, planned from `stacked`, into the plan of the original
// sides: every piece over a stacked tensor becomes its members (runs where
// they step regularly, else plain pieces); names are appended to Plan.names;
// reduce, quantize and scale references to moved plain pieces follow them;
// summary.num_pieces and num_relay_pieces count expanded pieces.
absl::Status UnstackPlan(const StackedSides& stacked, const CompiledSide& source,
                         const CompiledSide& destination, v1::Plan* plan);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_STACKING_H_
