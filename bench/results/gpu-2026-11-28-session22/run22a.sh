#!/usr/bin/env bash
# Session 22 run A (2 GPUs): flip commits (docs/commit-flip.md) against swap and in place,
# in one call; the in-place colocated path against session 21's build (bin/*_before).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; date -u; grep -h "NCCL version" /dev/null; } | tee "$OUT/env.txt"
for t in shadow_swap shadow_set; do
  echo "=== $t" >>"$OUT/tests.log"
  timeout 200 $b/wsync_gpu_${t}_test >>"$OUT/tests.log" 2>&1 || echo "FAILED: $t" >>"$OUT/tests.log"
done
grep -E '^===|^\[  (PASSED|FAILED)|FAILED:' "$OUT/tests.log"
run() {  # bin model args...
  local bin=$1 m=$2; shift 2
  echo "=== $bin $m $*" >>"$OUT/sync.log"
  timeout 200 $b/$bin --model "$m" --iters 9 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $bin $m $*" >>"$OUT/sync.log"
}
for m in llama3-8b qwen3-30b-a3b; do
  run wsync_bench_gpu_sync_before $m --mode colocated --direct 1
  run wsync_bench_gpu_sync $m --mode colocated --direct 1
  run wsync_bench_gpu_sync $m --mode colocated --staging device_shadow --commit swap
  run wsync_bench_gpu_sync $m --mode colocated --staging device_shadow --commit flip
  run wsync_bench_gpu_sync_before $m --mode colocated --direct 1
  run wsync_bench_gpu_sync $m --mode colocated --direct 1
done
run wsync_bench_gpu_sync llama3-8b --mode tp1 --direct 1
run wsync_bench_gpu_sync llama3-8b --mode tp1 --staging device_shadow --commit flip --checksums 1
run wsync_bench_gpu_sync llama3-8b --mode colocated1 --staging device_shadow --commit flip
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|"bench":"[a-z_]+"|"mode":"[a-z0-9]+"|"worker":[0-9]|"median_s":[0-9.]+|"run_median_s":[0-9.]+|"commit_median_s":[0-9.]+|"commit_max_s":[0-9.]+|"commit_copy_median_s":[0-9.]+|"commit_swap_median_s":[0-9.]+|"commit":"[a-z]+"|"commit_bytes":[0-9]+|"checksum_match":[a-z]+|"buckets_verified":-?[0-9]+' | paste -sd' ' | sed 's/===/\n===/g; s/"bench"/\n  "bench"/g'
cp "$OUT"/*.log "$OUT/env.txt" "$OUT/" 2>/dev/null; true
