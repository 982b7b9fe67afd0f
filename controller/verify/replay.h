// Executes a whole plan on host byte arrays (every buffer of every worker,
// both sides): the planner's test oracle and `wsyncctl plan --verify`.
// Semantics per round: the staged buckets of the round are packed first
// (sender views, cast to the wire dtype); then, step by step (Bucket.step),
// the zero-copy network buckets of the step are read and then written; then
// the staged buckets are unpacked (cast to the destination dtype) and
// finally the round's reduces run (inputs in accumulate dtype, result cast
// into the destination view). So a relay reads fresh bytes only when a
// zero-copy bucket of an earlier step of its round, or an earlier round,
// brought them; placed in the same step, or staged, it reads stale bytes,
// exactly like the real engine.
// Before executing, the plan's structure is checked: every bucket has one
// SEND and one RECV (or one COPY) on the right workers in its round, seq
// matches, pieces fit their bucket without overlap, zero-copy claims hold,
// reduce inputs share the reduce's round, staging_bytes is right.
#ifndef WSYNC_CONTROLLER_VERIFY_REPLAY_H_
#define WSYNC_CONTROLLER_VERIFY_REPLAY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/plan/compiled_layout.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

class HostMemory {
 public:
  using Key = std::tuple<int32_t, int, std::string>;  // worker, BufferSide, buffer

  std::vector<uint8_t>* Find(int32_t worker, v1::BufferSide side, const std::string& buffer);
  // Creates (zero-filled) or grows the buffer to at least `bytes`.
  std::vector<uint8_t>& Ensure(int32_t worker, v1::BufferSide side, const std::string& buffer,
                               int64_t bytes);
  const std::map<Key, std::vector<uint8_t>>& buffers() const { return buffers_; }

 private:
  std::map<Key, std::vector<uint8_t>> buffers_;
};

// The host bytes each buffer both sides reference needs: per (worker,
// side, buffer), the end of its furthest fragment, strides counted. Errors
// (INVALID_ARGUMENT) name the side, tensor and rank whose extent overflows.
absl::StatusOr<std::map<HostMemory::Key, int64_t>> ReplayBufferBytes(
    const CompiledSide& source, const CompiledSide& destination);

// Allocates every buffer both sides reference, large enough for all
// fragments (ReplayBufferBytes), zero-filled. An allocation the host cannot
// make is RESOURCE_EXHAUSTED naming the buffer, not an exception.
absl::Status AllocateBuffers(const CompiledSide& source, const CompiledSide& destination,
                             HostMemory* mem);

// Piece runs (common/plan_pieces.h) replay as the pieces they stand for:
// CheckPlanRuns first (hostile runs are INVALID_ARGUMENT naming bucket and
// run), then the plan with its runs written out is replayed.
absl::Status ReplayPlan(const v1::Plan& plan, HostMemory* mem);

// Element-id test data: an integer value of (tensor, linear index) in
// [-range, range], exactly representable in every dtype of the transfer.
double SyntheticValue(const std::string& tensor, int64_t linear_index, int64_t range);
// The largest range exact in `dtype` with room for partial sums.
int64_t SyntheticRange(v1::DType dtype);

// Writes SyntheticValue into every source fragment (partial group members
// get summands whose reduction is exactly the value).
absl::Status FillSource(const CompiledSide& source, int64_t range, HostMemory* mem);

// Checks every element of every destination fragment against the value of
// the source element its mapping names. Errors name tensor, worker, index.
absl::Status CheckDestination(const v1::TransferSpec& spec, const CompiledSide& source,
                              const CompiledSide& destination, int64_t range,
                              const HostMemory& mem);

// Compile, allocate, fill, replay, check: the whole oracle in one call.
absl::Status VerifyPlan(const v1::TransferSpec& spec, const v1::Plan& plan);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_VERIFY_REPLAY_H_
