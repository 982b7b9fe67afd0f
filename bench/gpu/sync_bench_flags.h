// wsync_bench_gpu_sync's command line (sync_bench.cc lists the flags).
#ifndef WSYNC_BENCH_GPU_SYNC_BENCH_FLAGS_H_
#define WSYNC_BENCH_GPU_SYNC_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/gpu/bench_cases.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/exec/executor.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::bench {

struct Flags {
  std::string model = "llama3-8b";
  std::vector<std::string> modes = {"tp1", "colocated"};
  int iters = 5;
  int pause_ms = 0;  // idle before each measured sync
  int64_t bucket_mib = 256, staging_mib = 2048, zero_copy_mib = 32;
  double nvlink_gbps = 368, bidir_gbps = 354, copy_gbps = 2071;
  std::string dump_shapes;
  std::string spec_file;            // --spec: mode "spec" syncs this TransferSpec (JSON)
  bool measure_issue_keys = false;  // CPU only: time the data ops' cache keys per round
  bool pipeline = true;             // ExecutorOptions::pipeline (0: the unpipelined baseline)
  int blocks_per_sm = 8;            // CudaDataOps::Options::blocks_per_sm
  // Direct writes for every eligible pair (controller/plan/routes.h):
  // each worker maps its peers' destination slabs by CUDA IPC.
  bool direct = false;
  // --put-phases: direct writes in put phases (controller/plan/put_phases.h).
  bool put_phases = true;
  bool piece_runs = true;  // --piece-runs: the planner writes PieceRuns
  // --put-gates: phase gates between them (worker/exec/phase_gates.h) and
  // --put-gate-timeout-ms.
  bool put_gates = exec::ExecutorOptions().put_phase_gates;
  int64_t put_gate_timeout_ms = absl::ToInt64Milliseconds(exec::ExecutorOptions().put_gate_timeout);
  // Diagnosis only (checksums then fail): "local" drops every local copy,
  // "puts" every direct write, to time the other part alone.
  std::string diagnose_drop;
  bool diagnose_raw_puts = false;  // also time the puts alone through the data ops
  // Each slab's allocation is a multiple of this, as PyTorch's caching
  // allocator rounds large segments to 2 MiB (see slabs.h); 0: 256 bytes.
  int64_t slab_round_kib = 2048;
  bool diagnose_ce_probes = false;           // time copy-engine peer writes at each set-up step
  std::string diagnose_barrier = "spin";     // with probes: diagnoses meet on "spin" or "nccl"
  int64_t put_copy_engine_kib = 4096;        // CudaDataOps::Options::put_copy_engine_min_bytes
  int64_t put_copy_engine_row_bytes = 8192;  // ...::put_copy_engine_min_row_bytes
  int put_blocks_per_sm = 1;                 // CudaDataOps::Options::put_blocks_per_sm
  int put_copy_streams = cuda::CudaDataOps::Options().put_copy_streams;  // --put-copy-streams
  int reserved_sms = 0;            // CudaDataOps::Options::reserved_sms
  int put_reserved_sms = 48;       // CudaDataOps::Options::put_reserved_sms
  int64_t put_interleave_mib = 0;  // CudaDataOps::Options::put_interleave_mib
  int hash_blocks_per_sm = 4;      // CudaDataOps::Options::hash_blocks_per_sm
  // Checksum parts (ExecutorOptions): landing_parts, min_landing_part_bytes
  // (MiB), direct_part_tail_ratio; the same on every worker of the run.
  int landing_parts = exec::ExecutorOptions().landing_parts;
  int64_t min_landing_part_mib = exec::ExecutorOptions().min_landing_part_bytes >> 20;
  int part_tail_ratio = exec::ExecutorOptions().direct_part_tail_ratio;
  int early_local_rounds = exec::ExecutorOptions().early_local_rounds;
  bool mailbox = exec::ExecutorOptions().mailbox_tokens;  // --mailbox
  bool timeline = false;                                  // print each timed sync's device timeline
  // Staged syncs (bench/gpu/staged_run.h): where receivers write, and
  // whether every network bucket is checksummed on both sides.
  v1::StagingMode staging = v1::STAGING_IN_PLACE;
  bool checksums = false;
  // --commit swap (docs/commit-swap.md): each worker's destination slab is
  // one CUDA weight arena, so a device_shadow commit swaps it with a twin
  // instead of copying ("copy": a cudaMalloc slab, the copy commit).
  bool commit_swap = false;
  bool commit_flip = false;  // --commit flip (docs/commit-flip.md)
  // --commit-barrier 1 (default): every worker finishes its run before any
  // commits, as the controller's two phases do (all staged, then commit);
  // 0: each commits right after its own run (sessions 15-19's figures).
  bool commit_barrier = true;
  // --finish-barrier 1: a swap commit's second half (the twin's remap) waits
  // until every worker's commit returned (0, default: right after its own,
  // as the worker does).
  bool finish_barrier = false;
};

CaseParams ParamsOf(const Flags& f);
// The executor's options the flags set.
exec::ExecutorOptions ExecutorOptionsOf(const Flags& f);

// Parses "--flag value" pairs into *f: 0, or 2 after logging the bad flag.
int ParseFlags(int argc, char** argv, Flags* f);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_SYNC_BENCH_FLAGS_H_
