#!/usr/bin/env bash
# Session 22 run D (4 GPUs): issue 20 on 4 GPUs with two replicas: fanout_dp2 (a trainer GPU to two
# TP1 replicas... as bench_cases.cc defines it) and colocated4, in place against flip, swap, copy
# commits and host shadow; session 21's build for the in-place A/B.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
b=.devbundle/bin
{ nvidia-smi -L; nvidia-smi topo -m | head -6; date -u; } | tee "$OUT/env.txt"
run() {
  local bin=$1 m=$2; shift 2
  echo "=== $bin $m $*" >>"$OUT/sync.log"
  timeout 150 $b/$bin --model "$m" --iters 7 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $bin $m $*" >>"$OUT/sync.log"
}
for m in llama3-8b qwen3-30b-a3b; do
  run wsync_bench_gpu_sync_before $m --mode fanout_dp2,colocated4 --direct 1
  run wsync_bench_gpu_sync $m --mode fanout_dp2,colocated4 --direct 1
  run wsync_bench_gpu_sync $m --mode fanout_dp2,colocated4 --staging device_shadow --commit flip --checksums 1
  run wsync_bench_gpu_sync $m --mode fanout_dp2,colocated4 --staging device_shadow --commit swap
  run wsync_bench_gpu_sync $m --mode fanout_dp2,colocated4 --staging device_shadow
done
run wsync_bench_gpu_sync llama3-8b --mode fanout_dp2,colocated4 --staging host_shadow --checksums 1
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|"bench":"[a-z_]+"|"mode":"[a-z0-9_]+"|"worker":[0-9]|"median_s":[0-9.]+|"commit_median_s":[0-9.]+|"commit_max_s":[0-9.]+|"commit_copy_median_s":[0-9.]+|"commit_swap_median_s":[0-9.]+|"commit":"[a-z]+"|"owner_pointers":[0-9]+|"owner_switch_median_s":[0-9.]+|"checksum_match":[a-z]+' | paste -sd' ' | sed 's/===/\n===/g; s/"bench"/\n  "bench"/g' > "$OUT/summary.txt"
grep -E "^===|wsync_staged|wsync_sync\"|FAILED|checksum_match" "$OUT/summary.txt" | grep -v '"commit":"none"' | cut -c1-200
