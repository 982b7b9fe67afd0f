#!/usr/bin/env bash
# Session 22 run C (2 GPUs): issue 20's figures in one call on the flip tree: for Llama-3-8B and
# Qwen3-30B-A3B, TP1 (disjoint) and colocated: in place (direct writes, and through NCCL with
# checksums off / on), staged device shadow with flip / swap / copy commits, staged host shadow;
# the in-place colocated path against session 21's build (bin/*_before); the GPU tests.
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
run() {
  local bin=$1 m=$2; shift 2
  echo "=== $bin $m $*" >>"$OUT/sync.log"
  timeout 200 $b/$bin --model "$m" --iters 9 "$@" >>"$OUT/sync.log" 2>&1 || echo "FAILED $bin $m $*" >>"$OUT/sync.log"
}
for m in llama3-8b qwen3-30b-a3b; do
  for mode in tp1 colocated; do
    run wsync_bench_gpu_sync_before $m --mode $mode --direct 1
    run wsync_bench_gpu_sync $m --mode $mode --direct 1
    run wsync_bench_gpu_sync $m --mode $mode --direct 0
    run wsync_bench_gpu_sync $m --mode $mode --direct 0 --checksums 1
    run wsync_bench_gpu_sync $m --mode $mode --staging device_shadow --commit flip --checksums 1
    run wsync_bench_gpu_sync $m --mode $mode --staging device_shadow --commit swap
    run wsync_bench_gpu_sync $m --mode $mode --staging device_shadow
    run wsync_bench_gpu_sync $m --mode $mode --staging host_shadow --checksums 1
  done
done
grep -E '^===|RESULT|FAILED' "$OUT/sync.log" | grep -v wsync_plan | grep -oE '^===.*|FAILED.*|"bench":"[a-z_]+"|"worker":[0-9]|"median_s":[0-9.]+|"commit_median_s":[0-9.]+|"commit_max_s":[0-9.]+|"commit_copy_median_s":[0-9.]+|"commit_swap_median_s":[0-9.]+|"commit":"[a-z]+"|"owner_pointers":[0-9]+|"owner_switch_median_s":[0-9.]+|"buckets_verified":-?[0-9]+|"checksum_match":[a-z]+' | paste -sd' ' | sed 's/===/\n===/g; s/"bench"/\n  "bench"/g' > "$OUT/summary.txt"
cat "$OUT/summary.txt" | grep -E "^===|wsync_staged|wsync_flip|\"bench\":\"wsync_sync\"" | cut -c1-260
