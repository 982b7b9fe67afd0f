#include "bench/gpu/sync_bench_flags.h"

#include "absl/strings/str_split.h"
#include "bench/gpu/staged_run.h"
#include "common/logging.h"

namespace wsync::bench {

CaseParams ParamsOf(const Flags& f) {
  CaseParams p;
  p.model = f.model;
  p.spec_file = f.spec_file;
  p.bucket_mib = f.bucket_mib;
  p.staging_mib = f.staging_mib;
  p.zero_copy_mib = f.zero_copy_mib;
  p.nvlink_gbps = f.nvlink_gbps;
  p.copy_gbps = f.copy_gbps;
  p.piece_runs = f.piece_runs;
  return p;
}

int ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      f->model = v;
    else if (k == "--spec")
      f->spec_file = v;
    else if (k == "--mode")
      f->modes = absl::StrSplit(v, ',');
    else if (k == "--iters")
      f->iters = std::stoi(v);
    else if (k == "--pause-ms")
      f->pause_ms = std::stoi(v);
    else if (k == "--bucket-mib")
      f->bucket_mib = std::stoll(v);
    else if (k == "--staging-mib")
      f->staging_mib = std::stoll(v);
    else if (k == "--zero-copy-mib")
      f->zero_copy_mib = std::stoll(v);
    else if (k == "--nvlink-gbps")
      f->nvlink_gbps = std::stod(v);
    else if (k == "--bidir-gbps")
      f->bidir_gbps = std::stod(v);
    else if (k == "--copy-gbps")
      f->copy_gbps = std::stod(v);
    else if (k == "--dump-shapes")
      f->dump_shapes = v;
    else if (k == "--measure-issue-keys")
      f->measure_issue_keys = v != "0";
    else if (k == "--pipeline")
      f->pipeline = v != "0";
    else if (k == "--blocks-per-sm")
      f->blocks_per_sm = std::stoi(v);
    else if (k == "--direct")
      f->direct = v != "0";
    else if (k == "--put-phases")
      f->put_phases = v != "0";
    else if (k == "--piece-runs")
      f->piece_runs = v != "0";
    else if (k == "--put-gates")
      f->put_gates = v != "0";
    else if (k == "--put-gate-timeout-ms")
      f->put_gate_timeout_ms = std::stoll(v);
    else if (k == "--diagnose-drop")
      f->diagnose_drop = v;
    else if (k == "--diagnose-raw-puts")
      f->diagnose_raw_puts = v != "0";
    else if (k == "--diagnose-ce-probes")
      f->diagnose_ce_probes = v != "0";
    else if (k == "--reserved-sms")
      f->reserved_sms = std::stoi(v);
    else if (k == "--put-reserved-sms")
      f->put_reserved_sms = std::stoi(v);
    else if (k == "--put-interleave-mib")
      f->put_interleave_mib = std::stoll(v);
    else if (k == "--early-local-rounds")
      f->early_local_rounds = std::stoi(v);
    else if (k == "--mailbox")
      f->mailbox = v != "0";
    else if (k == "--timeline")
      f->timeline = std::stoi(v) != 0;
    else if (k == "--slab-round-kib")
      f->slab_round_kib = std::stoll(v);
    else if (k == "--diagnose-barrier")
      f->diagnose_barrier = v;
    else if (k == "--put-copy-engine-kib")
      f->put_copy_engine_kib = std::stoll(v);
    else if (k == "--put-copy-engine-row-bytes")
      f->put_copy_engine_row_bytes = std::stoll(v);
    else if (k == "--put-blocks-per-sm")
      f->put_blocks_per_sm = std::stoi(v);
    else if (k == "--hash-blocks-per-sm")
      f->hash_blocks_per_sm = std::stoi(v);
    else if (k == "--landing-parts")
      f->landing_parts = std::stoi(v);
    else if (k == "--min-landing-part-mib")
      f->min_landing_part_mib = std::stoll(v);
    else if (k == "--part-tail-ratio")
      f->part_tail_ratio = std::stoi(v);
    else if (k == "--put-copy-streams")
      f->put_copy_streams = std::stoi(v);
    else if (k == "--staging") {
      auto mode = ParseStagingMode(v);
      if (!mode.ok()) {
        spdlog::error("{}", mode.status().ToString());
        return 2;
      }
      f->staging = *mode;
    } else if (k == "--commit") {
      if (v != "copy" && v != "swap" && v != "flip") {
        spdlog::error("--commit '{}': expected copy, swap or flip", v);
        return 2;
      }
      f->commit_swap = v == "swap";
      f->commit_flip = v == "flip";
    } else if (k == "--commit-barrier") {
      f->commit_barrier = v != "0";
    } else if (k == "--finish-barrier") {
      f->finish_barrier = v != "0";
    } else if (k == "--checksums")
      f->checksums = v != "0";
    else {
      spdlog::error("unknown flag {}", k);
      return 2;
    }
  }
  return 0;
}

exec::ExecutorOptions ExecutorOptionsOf(const Flags& f) {
  exec::ExecutorOptions eo;
  eo.pipeline = f.pipeline;
  eo.early_local_rounds = f.early_local_rounds;
  eo.mailbox_tokens = f.mailbox;
  eo.landing_parts = f.landing_parts;
  eo.min_landing_part_bytes = f.min_landing_part_mib << 20;
  eo.direct_part_tail_ratio = f.part_tail_ratio;
  eo.put_phase_gates = f.put_gates;
  eo.put_gate_timeout = absl::Milliseconds(f.put_gate_timeout_ms);
  return eo;
}

}  // namespace wsync::bench
