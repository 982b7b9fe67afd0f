#!/usr/bin/env bash
# Session 21 run C (2 GPUs): the final tree's staged paths: GPU tests, a staged TP1
# run where one worker only sends (the barrier fix), colocated swap once more.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; date -u; } | tee "$OUT/env.txt"
for t in shadow_swap shadow_set data_ops; do
  echo "=== $t" >>"$OUT/tests.log"
  timeout 200 $b/wsync_gpu_${t}_test >>"$OUT/tests.log" 2>&1 || echo "FAILED: $t" >>"$OUT/tests.log"
done
grep -E '^===|^\[  (PASSED|FAILED)|FAILED:' "$OUT/tests.log"
for v in "--mode tp1 --staging device_shadow --checksums 1" "--mode tp1 --staging device_shadow --commit swap" "--mode colocated --direct 1" "--mode colocated --staging device_shadow --commit swap"; do
  echo "=== $v" >>"$OUT/sync.log"
  timeout 200 $b/wsync_bench_gpu_sync --model llama3-8b --iters 9 $v >>"$OUT/sync.log" 2>&1 || echo "FAILED $v" >>"$OUT/sync.log"
done
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|"bench":"[a-z_]+"|"mode":"[a-z0-9]+"|"worker":[0-9]|"median_s":[0-9.]+|"commit_median_s":[0-9.]+|"commit_swap_median_s":[0-9.]+|"commit":"[a-z]+"|"checksum_match":[a-z]+|"buckets_verified":-?[0-9]+' | paste -sd' ' | sed 's/===/\n===/g; s/"bench"/\n  "bench"/g'
