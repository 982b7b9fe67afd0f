// The cases wsync_bench_gpu_sync runs: a catalog model in one of its modes
// (tp1, colocated, colocated1, fanout_tp2, fanout_dp2, colocated4), or a TransferSpec
// from a JSON file (mode "spec", e.g. the one tests/python/gpu/sync_proof.py
// synced), planned with the benchmark's bucket / staging options and link
// rates. All ranks of a case share one node.
#ifndef WSYNC_BENCH_GPU_BENCH_CASES_H_
#define WSYNC_BENCH_GPU_BENCH_CASES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::bench {

struct CaseParams {
  std::string model = "llama3-8b";  // catalog model (not mode "spec")
  std::string spec_file;            // mode "spec": its sides must list their workers
  int64_t bucket_mib = 256, staging_mib = 2048, zero_copy_mib = 32;
  double nvlink_gbps = 368, copy_gbps = 2071;  // the simulator's rates
  bool piece_runs = true;  // plan::BuildOptions::emit_piece_runs
};

struct Case {
  std::string mode;
  v1::TransferSpec spec;
  v1::Plan plan;
  double plan_seconds = 0;
  int workers = 0;  // the highest worker either side names, plus one
};

// The case of `mode` (INVALID_ARGUMENT for an unknown one, NOT_FOUND or
// INVALID_ARGUMENT for an unreadable or incomplete spec file), planned.
absl::StatusOr<Case> MakeCase(const CaseParams& params, const std::string& mode);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_BENCH_CASES_H_
