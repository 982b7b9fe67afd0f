// Swap commits (docs/commit-swap.md): the byte runs a part's written views
// cover inside their buffers. The commit copies live -> twin every arena byte
// outside them, so the list must be exact and bounded; a view that cannot be
// listed (or only as too many or too small runs) makes the commit copy
// instead, for the reason returned.
#ifndef WSYNC_WORKER_AGENT_SWAP_RUNS_H_
#define WSYNC_WORKER_AGENT_SWAP_RUNS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::agent {

// At most this many runs over a part's views (each run not written is one
// copy item of the commit).
inline constexpr size_t kMaxSwapRuns = size_t{1} << 20;
// A view listing as more than one run needs runs of at least this many
// bytes: thousands of tiny runs (a view over single elements of a column)
// would make the commit's complement thousands of tiny copies, slower than
// the copy commit of the view itself.
inline constexpr int64_t kMinSwapRunBytes = 256;

// Appends to `runs` the byte ranges [begin, end) that `v` covers inside a
// buffer of `extent` bytes: one per contiguous run of its innermost dense
// dims (a strided view, e.g. a chunk of stacked experts over part of their
// rows, has several). Runs of different views may overlap. On refusal
// appends nothing and returns INVALID_ARGUMENT (a negative offset, shape or
// stride, a stride of 0 on a dim of more than one element, fewer strides
// than dims, an unknown dtype, a view past the extent, any overflow) or
// RESOURCE_EXHAUSTED (more than one run of under kMinSwapRunBytes, or
// `runs` past kMaxSwapRuns), saying why.
absl::Status AppendSwapRuns(const v1::TensorView& v, int64_t extent,
                            std::vector<std::pair<int64_t, int64_t>>* runs);

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_SWAP_RUNS_H_
