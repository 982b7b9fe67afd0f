// Helpers shared by the replay oracle's files (replay.cc, replay_structure.cc,
// replay_check.cc); not a public interface.
#ifndef WSYNC_CONTROLLER_VERIFY_REPLAY_INTERNAL_H_
#define WSYNC_CONTROLLER_VERIFY_REPLAY_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/block_fp8.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan::replay_detail {

// Number of elements of a view (product of its shape).
int64_t ViewElems(const v1::TensorView& v);

// Block grid of a quantized view: blocks over its last two dims. Fails
// (naming `what`) unless the view has >= 2 dims and 2 positive blocks.
absl::StatusOr<BlockGrid> GridOf(const google::protobuf::RepeatedField<int64_t>& shape,
                                 const google::protobuf::RepeatedField<int64_t>& block,
                                 const std::string& what);

// Checks the plan's structure before it runs: every bucket has one SEND and
// one RECV (or one COPY) on the right workers in its round, seq matches,
// pieces fit their bucket without overlap, zero-copy claims hold, reduce and
// quantize inputs share their op's round and worker, staging_bytes is right,
// every reduce and quantize has exactly one op. The plan has no piece runs
// (ReplayPlan writes them out first): a bucket with runs is refused.
absl::Status CheckPlanStructure(const v1::Plan& plan);

}  // namespace wsync::plan::replay_detail

#endif  // WSYNC_CONTROLLER_VERIFY_REPLAY_INTERNAL_H_
