#!/usr/bin/env bash
# Session 21 run A (2 GPUs): where a swap commit's pause goes, colocated.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; date -u; } | tee "$OUT/env.txt"
timeout 120 $b/wsync_gpu_shadow_swap_test >"$OUT/swap_test.log" 2>&1; grep -E '^\[  (PASSED|FAILED)' "$OUT/swap_test.log"
sw="--staging device_shadow --commit swap"
run() {  # model reps variants...
  local m=$1 reps=$2; shift 2
  for rep in $(seq $reps); do
    for v in "$@"; do
      echo "=== $m rep $rep: $v" >>"$OUT/sync.log"
      timeout 200 $b/wsync_bench_gpu_sync --model $m --mode colocated --iters ${ITERS:-15} $v >>"$OUT/sync.log" 2>&1 || echo "FAILED $v" >>"$OUT/sync.log"
    done
  done
}
run llama3-8b 2 "--direct 1" "$sw --commit-barrier 1" "$sw --commit-barrier 1 --finish-barrier 1" "$sw --commit-barrier 0"
run qwen3-30b-a3b 1 "--direct 1" "$sw --commit-barrier 1" "$sw --commit-barrier 1 --finish-barrier 1"
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | sed -E 's/("bench":"wsync_sync".*"median_s":[0-9.]+).*/\1/' | sed -E 's/"checksums_taken.*"buckets_verified":-?[0-9]+,//; s/"bench":"wsync_sync_check".*//' | cut -c1-600
