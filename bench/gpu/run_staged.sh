#!/usr/bin/env bash
# Issue 20's GPU figures in one call, from the repo root on a GPU machine
# (carry .devbundle, built by `bash scripts/gpu_run.sh build`):
#   bash bench/gpu/run_staged.sh [tests] [swap] [sync]
# tests  the GPU tests of staged syncs (checksum kernel, CUDA shadows, data ops)
# swap   wsync_bench_vmm_swap: copy commit vs cuMem remap, per tensor and arena
#        (the arena at each VA alignment of WSYNC_SWAP_ALIGN_MIB, default "0 1024")
# sync   wsync_bench_gpu_sync, one line per variant and mode: in place (direct
#        writes on and off), in place + checksums, device shadow with and
#        without checksums, device shadow with a swap commit (docs/commit-swap.md),
#        host shadow + checksums (docs/staging.md)
# WSYNC_BENCH_MODELS (default "llama3-8b qwen3-30b-a3b"), WSYNC_SYNC_MODES
# (default tp1,colocated; with 4 GPUs fanout_dp2,colocated4), WSYNC_BENCH_ITERS.
# Results: $OUT/{env.txt,staged_tests.log,vmm_swap.log,staged_sync.log}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. bench/gpu/device_env.sh
wsync_gpu_out
bin=$PWD/.devbundle/bin
wsync_device_env
steps=${*:-tests swap sync}
ngpu=$(nvidia-smi -L | wc -l)
wsync_env_lines nccl >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
rc=0
models=${WSYNC_BENCH_MODELS:-llama3-8b qwen3-30b-a3b}
if [[ " $steps " == *" tests "* ]]; then
  for t in checksum_kernel shadow_set shadow_swap data_ops executor; do
    echo "=== wsync_gpu_${t}_test" >>"$OUT/staged_tests.log"
    timeout 240 "$bin/wsync_gpu_${t}_test" >>"$OUT/staged_tests.log" 2>&1 ||
      { rc=1; echo "FAILED: $t" >>"$OUT/staged_tests.log"; }
  done
  grep -E '^(=== |\[  (PASSED|FAILED|SKIPPED) |FAILED:)' "$OUT/staged_tests.log"
fi
if [[ " $steps " == *" swap "* ]]; then
  for m in $models; do
    for c in "tp1 1" "colocated 0"; do
      set -- $c
      # Per tensor at the granularity; one arena at each WSYNC_SWAP_ALIGN_MIB.
      for a in "0 0" $(for x in ${WSYNC_SWAP_ALIGN_MIB:-0 1024}; do echo "1,$x"; done); do
        arena=${a%%[ ,]*} align=${a##*[ ,]}
        timeout 300 "$bin/wsync_bench_vmm_swap" --model "$m" --mode "$1" --worker "$2" \
          --arena $arena --align-mib "$align" --iters "${WSYNC_BENCH_ITERS:-5}" \
          >>"$OUT/vmm_swap.log" 2>&1 ||
          { rc=1; echo "FAILED: vmm_swap $m $c $arena $align" >>"$OUT/vmm_swap.log"; }
      done
    done
  done
  grep -E 'RESULT|FAILED' "$OUT/vmm_swap.log"
fi
if [[ " $steps " == *" sync "* ]]; then
  modes=${WSYNC_SYNC_MODES:-tp1,colocated}
  [ -z "${WSYNC_SYNC_MODES:-}" ] && [ "$ngpu" -ge 4 ] && modes=fanout_dp2,colocated4
  IFS=';' read -ra variants <<<"${WSYNC_SYNC_VARIANTS:---direct 1;--direct 0;--direct 0 --checksums 1;--staging device_shadow;--staging device_shadow --commit swap;--staging device_shadow --checksums 1;--staging host_shadow --checksums 1}"
  for m in $models; do
    for v in "${variants[@]}"; do
      echo "=== $m $modes $v" >>"$OUT/staged_sync.log"
      timeout 400 "$bin/wsync_bench_gpu_sync" --model "$m" --mode "$modes" \
        --iters "${WSYNC_BENCH_ITERS:-5}" $v >>"$OUT/staged_sync.log" 2>&1 ||
        { rc=1; echo "FAILED: sync $m $v" >>"$OUT/staged_sync.log"; }
    done
  done
  grep -E '^===|wsync_staged|wsync_sync"|wsync_sync_check|FAILED' "$OUT/staged_sync.log" |
    sed -E 's/"ranks":\[.*\]//' | cut -c1-400
fi
exit $rc
