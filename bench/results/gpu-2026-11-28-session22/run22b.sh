#!/usr/bin/env bash
# Session 22 run B (2 GPUs): flip commits with the owner's switch timed apart from the
# worker's commit (the owner serves V-1 through the commit), Llama and Qwen colocated and
# TP1, swap beside; then the Python owner's p.data switch for the destination buffer counts.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; date -u; } | tee "$OUT/env.txt"
timeout 200 $b/wsync_gpu_shadow_swap_test >"$OUT/tests.log" 2>&1 || echo "FAILED: shadow_swap" >>"$OUT/tests.log"
grep -E '^\[  (PASSED|FAILED)|FAILED:' "$OUT/tests.log"
run() {
  local m=$1; shift
  echo "=== $m $*" >>"$OUT/sync.log"
  timeout 200 $b/wsync_bench_gpu_sync --model "$m" --iters 15 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $m $*" >>"$OUT/sync.log"
}
for m in llama3-8b qwen3-30b-a3b; do
  run $m --mode colocated --direct 1
  run $m --mode colocated --staging device_shadow --commit flip
  run $m --mode colocated --staging device_shadow --commit swap
  run $m --mode colocated --staging device_shadow --commit flip
  run $m --mode colocated --direct 1
done
run llama3-8b --mode tp1 --direct 1
run llama3-8b --mode tp1 --staging device_shadow --commit flip
run qwen3-30b-a3b --mode tp1 --direct 1
run qwen3-30b-a3b --mode tp1 --staging device_shadow --commit flip
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|"bench":"[a-z_]+"|"worker":[0-9]|"median_s":[0-9.]+|"commit_median_s":[0-9.]+|"commit_copy_median_s":[0-9.]+|"commit_swap_median_s":[0-9.]+|"commit":"[a-z]+"|"owner_pointers":[0-9]+|"owner_switch_median_s":[0-9.]+|"owner_switch_max_s":[0-9.]+|"checksum_match":[a-z]+' | paste -sd' ' | sed 's/===/\n===/g; s/"bench"/\n  "bench"/g'
python3 .exp/flip_probe.py 2>&1 | tee "$OUT/flip_probe.log"
