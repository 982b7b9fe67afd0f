#!/usr/bin/env bash
# Issue 20's checksum target in one call (<= 3 % of the sync time on
# Llama-3-8B TP1, same call with checksums off): direct writes off / on x
# checksums off / on (session 18: checksums keep direct writes), with the
# build before as a baseline (its direct + checksums variant is refused:
# FAILED lines for it are expected), binaries alternating (ABAB) so that
# drift shows:
#   bash bench/gpu/run_checksum_ab.sh [tests]
# Needs .devbundle (scripts/gpu_run.sh build) and, for the baseline,
# .devbundle/bin/wsync_bench_gpu_sync_base (the same bench built from the commit
# before; skipped when absent). tests: the NCCL conformance suite (landing
# parts), the plane conformance suite (wire checksums, put marks) and the
# executor / data-ops GPU tests first.
# WSYNC_BENCH_MODELS (default llama3-8b), WSYNC_SYNC_MODES (default
# tp1,colocated), WSYNC_BENCH_ITERS (default 7), WSYNC_AB_REPS (default 2),
# WSYNC_AB_VARIANTS (see below).
# Results: $OUT/{env.txt,ab_tests.log,checksum_ab.log}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. bench/gpu/device_env.sh
wsync_gpu_out
bin=$PWD/.devbundle/bin
wsync_device_env
wsync_env_lines nccl >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
rc=0
if [[ " $* " == *" tests "* ]]; then
  for t in nccl_conformance nccl_transport plane_conformance executor data_ops data_ops_put \
    checksum_kernel; do
    echo "=== wsync_gpu_${t}_test" >>"$OUT/ab_tests.log"
    timeout 240 "$bin/wsync_gpu_${t}_test" >>"$OUT/ab_tests.log" 2>&1 ||
      { rc=1; echo "FAILED: $t" >>"$OUT/ab_tests.log"; }
  done
  grep -E '^(=== |\[  (PASSED|FAILED|SKIPPED) |FAILED:)' "$OUT/ab_tests.log"
fi
# WSYNC_AB_VARIANTS: ';'-separated sync-bench flag sets.
IFS=';' read -ra variants <<<"${WSYNC_AB_VARIANTS:---direct 1;--direct 1 --checksums 1;--direct 0;--direct 0 --checksums 1}"
builds=(new)
[ -x "$bin/wsync_bench_gpu_sync_base" ] && builds+=(base)
modes=${WSYNC_SYNC_MODES:-tp1,colocated}
for rep in $(seq "${WSYNC_AB_REPS:-2}"); do
  for m in ${WSYNC_BENCH_MODELS:-llama3-8b}; do
    for b in "${builds[@]}"; do
      exe=$bin/wsync_bench_gpu_sync
      [ "$b" = base ] && exe=$bin/wsync_bench_gpu_sync_base
      for v in "${variants[@]}"; do
        echo "=== rep $rep build $b $m $modes $v" >>"$OUT/checksum_ab.log"
        timeout 300 "$exe" --model "$m" --mode "$modes" --iters "${WSYNC_BENCH_ITERS:-7}" $v \
          >>"$OUT/checksum_ab.log" 2>&1 || { rc=1; echo "FAILED: $b $m $v" >>"$OUT/checksum_ab.log"; }
      done
    done
  done
done
grep -E '^===|"wsync_sync"|wsync_staged|checksum_match|FAILED' "$OUT/checksum_ab.log" |
  sed -E 's/"ranks":\[.*\]//' | grep -oE '^===.*|"mode":"[a-z0-9_]+"|"worker":[0-9]|"median_s":[0-9.]+|"checksums_taken":[0-9]+|"recv_hashes_as_landed":[0-9]+|"direct_hashes_as_landed":[0-9]+|"direct_parts_posted":[0-9]+|"buckets_verified":-?[0-9]+|"checksum_match":[a-z]+|FAILED.*' |
  paste -sd' ' | sed 's/ === /\n=== /g'
exit $rc
