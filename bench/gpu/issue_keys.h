// sync_bench --measure-issue-keys: the host time CudaDataOps spends keying
// its table cache on each call of a sync (worker/backends/cuda/cuda_data_ops.cc keys a
// cached table by the serialized item list), for one worker of a bound plan.
// Runs on the CPU only: the buffers are carved from a made-up address and
// never touched.
#ifndef WSYNC_BENCH_GPU_ISSUE_KEYS_H_
#define WSYNC_BENCH_GPU_ISSUE_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::bench {

// One RESULT line per round with local copies, and one for the whole sync.
absl::Status MeasureIssueKeys(const v1::TransferSpec& spec, const v1::Plan& plan, int32_t worker,
                              const std::string& label);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_ISSUE_KEYS_H_
