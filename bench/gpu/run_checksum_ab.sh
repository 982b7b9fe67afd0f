#!/usr/bin/env bash
# Issue 20's checksum target in one call (<= 3 % of the sync time on
# Llama-3-8B TP1, same call with checksums off): first the checksum kernels'
# GB/s over 1 GiB (wsync_bench_wire_hash), then direct writes off / on x
# checksums off / on, plus the checksum settings to compare (session 19:
# parts shrinking toward the end, --part-tail-ratio, against session 18's
# equal parts, ratio 0; the hash grid), all variants in turn and the whole
# list repeated (ABAB), so that drift shows; with a baseline build too
# (.devbundle/bin/wsync_bench_gpu_sync_base, the same bench built from an
# earlier commit; skipped when absent) right after each variant:
#   bash bench/gpu/run_checksum_ab.sh [tests]
# Needs .devbundle (scripts/gpu_run.sh build). tests: the NCCL conformance
# suite (landing parts), the plane conformance suite (wire checksums, put
# marks), the executor / data-ops GPU tests and the checksum kernel test
# first.
# WSYNC_BENCH_MODELS (default llama3-8b; "llama3-8b qwen3-30b-a3b" adds Qwen),
# WSYNC_SYNC_MODES (default tp1,colocated), WSYNC_BENCH_ITERS (default 7),
# WSYNC_AB_REPS (default 2), WSYNC_AB_VARIANTS (';'-separated sync-bench
# flag sets; default below), WSYNC_AB_BASE_VARIANTS (those the baseline runs;
# default: the first four, without the flags it lacks).
# Results: $OUT/{env.txt,ab_tests.log,wire_hash.log,checksum_ab.log}; the
# summary line per variant and worker ends with direct_tail_hash_bytes (the
# bytes the receiver hashed after the last part landed).
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
if [ -x "$bin/wsync_bench_wire_hash" ]; then
  timeout 120 "$bin/wsync_bench_wire_hash" --iters 10 >"$OUT/wire_hash.log" 2>&1 ||
    { rc=1; echo "FAILED: wire_hash" >>"$OUT/wire_hash.log"; }
  grep -E 'RESULT|FAILED' "$OUT/wire_hash.log" | grep -oE '"case":"[a-z0-9_]+"|"blocks_per_sm":[0-9]+|"gbps":[0-9.]+|"match":[a-z]+|FAILED.*' |
    paste -d' ' - - - -
fi
base4="--direct 1;--direct 1 --checksums 1;--direct 0;--direct 0 --checksums 1"
IFS=';' read -ra variants <<<"${WSYNC_AB_VARIANTS:-$base4;--direct 1 --checksums 1 --part-tail-ratio 0;--direct 1 --checksums 1 --hash-blocks-per-sm 2}"
IFS=';' read -ra base_variants <<<"${WSYNC_AB_BASE_VARIANTS:-$base4}"
modes=${WSYNC_SYNC_MODES:-tp1,colocated}
for rep in $(seq "${WSYNC_AB_REPS:-2}"); do
  for m in ${WSYNC_BENCH_MODELS:-llama3-8b}; do
    for v in "${variants[@]}"; do
      echo "=== rep $rep build new $m $modes $v" >>"$OUT/checksum_ab.log"
      timeout 300 "$bin/wsync_bench_gpu_sync" --model "$m" --mode "$modes" \
        --iters "${WSYNC_BENCH_ITERS:-7}" $v >>"$OUT/checksum_ab.log" 2>&1 ||
        { rc=1; echo "FAILED: new $m $v" >>"$OUT/checksum_ab.log"; }
      [ -x "$bin/wsync_bench_gpu_sync_base" ] || continue
      for bv in "${base_variants[@]}"; do
        [ "$bv" = "$v" ] || continue
        echo "=== rep $rep build base $m $modes $v" >>"$OUT/checksum_ab.log"
        timeout 300 "$bin/wsync_bench_gpu_sync_base" --model "$m" --mode "$modes" \
          --iters "${WSYNC_BENCH_ITERS:-7}" $v >>"$OUT/checksum_ab.log" 2>&1 ||
          { rc=1; echo "FAILED: base $m $v" >>"$OUT/checksum_ab.log"; }
      done
    done
  done
done
grep -E '^===|"wsync_sync"|wsync_staged|checksum_match|FAILED' "$OUT/checksum_ab.log" |
  sed -E 's/"ranks":\[.*\]//' | grep -oE '^===.*|"mode":"[a-z0-9_]+"|"worker":[0-9]|"median_s":[0-9.]+|"local_wait_s":[0-9.]+|"checksums_taken":[0-9]+|"recv_hashes_as_landed":[0-9]+|"direct_hashes_as_landed":[0-9]+|"direct_parts_posted":[0-9]+|"direct_tail_hash_bytes":[0-9]+|"buckets_verified":-?[0-9]+|"checksum_match":[a-z]+|FAILED.*' |
  paste -sd' ' | sed 's/ === /\n=== /g'
exit $rc
