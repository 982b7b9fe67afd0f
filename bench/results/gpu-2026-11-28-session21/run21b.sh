#!/usr/bin/env bash
# Session 21 run B (one GPU): where a swap commit's pause goes.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; date -u; } | tee "$OUT/env.txt"
timeout 120 $b/wsync_gpu_shadow_swap_test >"$OUT/swap_test.log" 2>&1; grep -E '^\[  (PASSED|FAILED)' "$OUT/swap_test.log"
for m in ${MODELS:-llama3-8b}; do
for rep in 1 2; do
  for v in "--direct 0" "--staging device_shadow --commit swap" "--staging device_shadow"; do
    echo "=== $m rep $rep: $v" >>"$OUT/sync.log"
    timeout 200 $b/wsync_bench_gpu_sync --model $m --mode colocated1 --iters 15 $v >>"$OUT/sync.log" 2>&1 || echo "FAILED $v" >>"$OUT/sync.log"
  done
done
done
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | sed -E 's/("bench":"wsync_sync".*"median_s":[0-9.]+).*/\1/' | sed -E 's/"checksums_taken.*"buckets_verified":-?[0-9]+,//' | cut -c1-700
timeout 200 $b/wsync_bench_vmm_swap --model llama3-8b --mode tp1 --worker 1 --arena 1 --iters 9 --align-mib 1024 >"$OUT/vmm.log" 2>&1
grep -E 'RESULT' "$OUT/vmm.log" | cut -c1-900
